# Sourced by bench/run, bench/cpu, bench/instructions, bench/urlsession-floor/run and scripts/link-order.
#
#   start_nginx WORK_DIR NAME HTTP_BLOCK [WORKERS]
#                                         one nginx (one worker unless WORKERS), in WORK_DIR/NAME,
#                                         serving what HTTP_BLOCK (server and upstream blocks)
#                                         says; appends its pid to the caller's `pids` array
#   start_nginx_upstream WORK_DIR PORT    the benches' upstream: bench/cpu's 1 KiB JSON answer on
#                                         /, the same with `Cache-Control: max-age=3600` on
#                                         /cached, on 127.0.0.1, .2 and .3 (three endpoints for
#                                         a balanced upstream); returns once it answers
#   upstream_body                         that answer
#   wait_for URL                          up to 2 minutes (processes under valgrind start slowly)

upstream_body() {
  python3 -c 'import json; print(json.dumps({"items": [{"id": i, "name": "item-%d" % i} for i in range(40)]})[:1024])'
}

start_nginx() {
  local dir=$1/$2
  mkdir -p "$dir"
  cat > "$dir/nginx.conf" <<NGINX
worker_processes ${4:-1};
error_log $dir/error.log warn;
pid $dir/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body; proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fcgi; uwsgi_temp_path $dir/uwsgi; scgi_temp_path $dir/scgi;
  $3
}
NGINX
  nginx -c "$dir/nginx.conf" -g 'daemon off;' & pids+=($!)
}

start_nginx_upstream() {
  local body
  body=$(upstream_body)
  start_nginx "$1" upstream "server { listen 127.0.0.1:$2; listen 127.0.0.2:$2; listen 127.0.0.3:$2; keepalive_requests 1000000;
    location / { default_type application/json; return 200 '$body'; }
    location = /cached { default_type application/json; add_header Cache-Control \"max-age=3600\"; return 200 '$body'; } }"
  wait_for "http://127.0.0.1:$2/"
}

# Up to two minutes (WAIT_SECONDS to change: valgrind starting a Swift binary on a busy machine
# can take longer).
wait_for() {
  for _ in $(seq 1 $(( ${WAIT_SECONDS:-120} * 5 ))); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.2; done
  echo "not answering: $1" >&2; exit 1
}
