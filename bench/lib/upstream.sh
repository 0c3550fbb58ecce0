# Sourced by bench/instructions and scripts/link-order: one nginx, one worker, serving bench/cpu's
# 1 KiB JSON answer on / and the same answer with `Cache-Control: max-age=3600` on /cached.
#
#   start_nginx_upstream WORK_DIR PORT   (appends nginx's pid to the caller's `pids` array)
#   wait_for URL                         (up to 2 minutes: processes under valgrind start slowly)

upstream_body() {
  python3 -c 'import json; print(json.dumps({"items": [{"id": i, "name": "item-%d" % i} for i in range(40)]})[:1024])'
}

start_nginx_upstream() {
  local dir=$1/nginx port=$2 body
  body=$(upstream_body)
  mkdir -p "$dir"
  cat > "$dir/nginx.conf" <<NGINX
worker_processes 1;
error_log $dir/error.log warn;
pid $dir/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body; proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fcgi; uwsgi_temp_path $dir/uwsgi; scgi_temp_path $dir/scgi;
  server { listen 127.0.0.1:$port; keepalive_requests 1000000;
    location / { default_type application/json; return 200 '$body'; }
    location = /cached { default_type application/json; add_header Cache-Control "max-age=3600"; return 200 '$body'; } }
}
NGINX
  nginx -c "$dir/nginx.conf" -g 'daemon off;' & pids+=($!)
  wait_for "http://127.0.0.1:$port/"
}

wait_for() {
  for _ in $(seq 1 600); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.2; done
  echo "not answering: $1" >&2; exit 1
}
