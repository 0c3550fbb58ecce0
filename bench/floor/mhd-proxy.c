/* The floor under Portico's `nio` transport: the same architecture with no Swift in it.
 * libmicrohttpd reads the request on its thread (poll(), one daemon thread per core) and suspends
 * the connection; an upstream thread (one per core, epoll, each with its own keep-alive
 * connections to the upstream) is woken through an eventfd, sends a fixed GET, reads the answer
 * (Content-Length framing only) and resumes the connection; libmicrohttpd's thread, woken through
 * its ITC, sends the body. Two cross-thread hand-offs per request, as in Portico. No request
 * headers are forwarded, nothing is validated, logged or counted.
 *
 * With --one-thread there is no hand-off: each thread runs its own libmicrohttpd daemon in
 * external-epoll mode and its own upstream connections in one epoll loop, as nginx runs a worker.
 * What the two modes differ by is the price of handing each request to another thread and back.
 *
 *   mhd-proxy PORT UPSTREAM_PORT [--one-thread]
 */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

struct job {
    struct MHD_Connection *connection;
    int dispatched, failed;
    char buffer[16384];
    size_t length, body_offset, body_length;
    struct job *next;
};

struct upstream { int fd; struct job *job; };

struct worker {
    pthread_t thread;
    int epoll_fd, wake_fd;
    struct MHD_Daemon *daemon;   /* --one-thread: this thread's own daemon */
    pthread_mutex_t lock;
    struct job *queue;
    struct upstream *idle[1024];
    int idle_count;
};

static struct worker *workers;
static long worker_count;
static int one_thread;
static char daemon_mark;   /* the epoll tag of a daemon's own epoll descriptor (--one-thread) */
static unsigned long turn;
static uint16_t upstream_port;
static const char request_text[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: mhd-proxy\r\n\r\n";

static void finish(struct upstream *up, int failed) {
    struct job *job = up->job;
    up->job = NULL;
    job->failed = failed;
    MHD_resume_connection(job->connection);
}

static struct upstream *connect_upstream(struct worker *worker) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return NULL;
    struct sockaddr_in address = { .sin_family = AF_INET, .sin_port = htons(upstream_port) };
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) { close(fd); return NULL; }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct upstream *up = calloc(1, sizeof *up);
    up->fd = fd;
    struct epoll_event event = { .events = EPOLLIN, .data.ptr = up };
    epoll_ctl(worker->epoll_fd, EPOLL_CTL_ADD, fd, &event);
    return up;
}

static void drop(struct worker *worker, struct upstream *up) {
    epoll_ctl(worker->epoll_fd, EPOLL_CTL_DEL, up->fd, NULL);
    close(up->fd);
    free(up);
}

/* Sends the job's request on an idle upstream connection or a new one. A failure here comes
 * before anything was sent: with --one-thread the connection is not suspended yet (the caller
 * answers at once), otherwise it is resumed to answer 502. */
static void start(struct worker *worker, struct job *job) {
    struct upstream *up = worker->idle_count > 0 ? worker->idle[--worker->idle_count] : connect_upstream(worker);
    if (up != NULL && send(up->fd, request_text, sizeof request_text - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof request_text - 1)) {
        up->job = job;
        return;
    }
    if (up != NULL) drop(worker, up);
    job->failed = 1;
    if (!one_thread) MHD_resume_connection(job->connection);
}

static void readable(struct worker *worker, struct upstream *up) {
    struct job *job = up->job;
    if (job == NULL) {   /* an idle connection closed by the upstream: out of the idle list, then gone */
        for (int i = 0; i < worker->idle_count; i++) {
            if (worker->idle[i] == up) { worker->idle[i] = worker->idle[--worker->idle_count]; break; }
        }
        drop(worker, up);
        return;
    }
    ssize_t n = read(up->fd, job->buffer + job->length, sizeof job->buffer - 1 - job->length);
    if (n <= 0) { if (n < 0 && errno == EAGAIN) return; finish(up, 1); drop(worker, up); return; }
    job->length += (size_t)n;
    job->buffer[job->length] = 0;
    if (job->body_offset == 0) {
        char *end = strstr(job->buffer, "\r\n\r\n");
        if (end == NULL) return;
        job->body_offset = (size_t)(end + 4 - job->buffer);
        char *field = strcasestr(job->buffer, "\r\ncontent-length:");
        if (field == NULL) { finish(up, 1); drop(worker, up); return; }
        job->body_length = strtoul(field + 17, NULL, 10);
    }
    if (job->length < job->body_offset + job->body_length) return;
    finish(up, 0);
    if (worker->idle_count < 1024) worker->idle[worker->idle_count++] = up; else drop(worker, up);
}

static void *run(void *argument) {
    struct worker *worker = argument;
    struct epoll_event events[64];
    for (;;) {
        int timeout = -1;
        MHD_UNSIGNED_LONG_LONG next;
        if (one_thread && MHD_get_timeout(worker->daemon, &next) == MHD_YES) timeout = next > 60000 ? 60000 : (int)next;
        int n = epoll_wait(worker->epoll_fd, events, 64, timeout);
        for (int i = 0; i < n; i++) {
            if (events[i].data.ptr == &daemon_mark) {
                continue;   /* run below, with the connections resumed meanwhile */
            } else if (events[i].data.ptr == NULL) {
                uint64_t count;
                if (read(worker->wake_fd, &count, sizeof count) < 0) continue;
                pthread_mutex_lock(&worker->lock);
                struct job *jobs = worker->queue;
                worker->queue = NULL;
                pthread_mutex_unlock(&worker->lock);
                while (jobs != NULL) { struct job *next = jobs->next; start(worker, jobs); jobs = next; }
            } else {
                readable(worker, events[i].data.ptr);
            }
        }
        if (one_thread) MHD_run(worker->daemon);
    }
    return NULL;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    (void)url; (void)method; (void)version; (void)upload_data;
    struct job *job = *con_cls;
    if (job == NULL) { *con_cls = calloc(1, sizeof *job); return *con_cls ? MHD_YES : MHD_NO; }
    if (*upload_data_size != 0) { *upload_data_size = 0; return MHD_YES; }
    if (!job->dispatched) {
        job->dispatched = 1;
        job->connection = connection;
        if (one_thread) {
            start(cls, job);
            if (!job->failed) { MHD_suspend_connection(connection); return MHD_YES; }
        } else {
            MHD_suspend_connection(connection);
            struct worker *worker = &workers[__atomic_fetch_add(&turn, 1, __ATOMIC_RELAXED) % (unsigned long)worker_count];
            pthread_mutex_lock(&worker->lock);
            job->next = worker->queue;
            worker->queue = job;
            pthread_mutex_unlock(&worker->lock);
            uint64_t one = 1;
            if (write(worker->wake_fd, &one, sizeof one) < 0) return MHD_NO;
            return MHD_YES;
        }
    }
    struct MHD_Response *response = job->failed
        ? MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT)
        : MHD_create_response_from_buffer(job->body_length, job->buffer + job->body_offset, MHD_RESPMEM_MUST_COPY);
    if (response == NULL) return MHD_NO;
    MHD_add_response_header(response, "Content-Type", "application/json");
    enum MHD_Result queued = MHD_queue_response(connection, job->failed ? 502 : 200, response);
    MHD_destroy_response(response);
    return queued;
}

static void completed(void *cls, struct MHD_Connection *connection, void **con_cls, enum MHD_RequestTerminationCode code) {
    (void)cls; (void)connection; (void)code;
    free(*con_cls);
    *con_cls = NULL;
}

int main(int argc, char **argv) {
    one_thread = argc == 4 && strcmp(argv[3], "--one-thread") == 0;
    if (argc != 3 && !one_thread) { fprintf(stderr, "usage: mhd-proxy PORT UPSTREAM_PORT [--one-thread]\n"); return 2; }
    upstream_port = (uint16_t)atoi(argv[2]);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    worker_count = cores > 0 ? cores : 1;
    workers = calloc((size_t)worker_count, sizeof *workers);
    sigset_t set; sigemptyset(&set); sigaddset(&set, SIGTERM); sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    for (long i = 0; i < worker_count; i++) {
        struct worker *worker = &workers[i];
        pthread_mutex_init(&worker->lock, NULL);
        worker->epoll_fd = epoll_create1(0);
        worker->wake_fd = eventfd(0, EFD_NONBLOCK);
        struct epoll_event event = { .events = EPOLLIN, .data.ptr = NULL };
        epoll_ctl(worker->epoll_fd, EPOLL_CTL_ADD, worker->wake_fd, &event);
        if (one_thread) {
            worker->daemon = MHD_start_daemon(
                MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME, (uint16_t)atoi(argv[1]), NULL, NULL, answer, worker,
                MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
                MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(48 * 1024), MHD_OPTION_CONNECTION_TIMEOUT, 60u, MHD_OPTION_END);
            const union MHD_DaemonInfo *info = worker->daemon ? MHD_get_daemon_info(worker->daemon, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
            if (info == NULL) { fprintf(stderr, "MHD_start_daemon (epoll) failed\n"); return 1; }
            struct epoll_event daemon_event = { .events = EPOLLIN, .data.ptr = &daemon_mark };
            epoll_ctl(worker->epoll_fd, EPOLL_CTL_ADD, info->epoll_fd, &daemon_event);
        }
        pthread_create(&worker->thread, NULL, run, worker);
    }
    /* One daemon per thread on one port (SO_REUSEPORT), as Portico runs one daemon per thread. */
    for (long i = 0; i < worker_count && !one_thread; i++) {
        struct MHD_Daemon *daemon = MHD_start_daemon(
            MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME, (uint16_t)atoi(argv[1]), NULL, NULL,
            answer, NULL, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(48 * 1024), MHD_OPTION_CONNECTION_TIMEOUT, 60u, MHD_OPTION_END);
        if (daemon == NULL) { fprintf(stderr, "MHD_start_daemon failed\n"); return 1; }
    }
    int signal_number; sigwait(&set, &signal_number);
    _exit(0);   /* MHD_stop_daemon aborts while connections are suspended; nothing here needs a drain */
}
