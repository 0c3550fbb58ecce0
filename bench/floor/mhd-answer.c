/* The floor under a Portico cache hit: libmicrohttpd alone, answering every request with a fixed
 * 1 KiB body from memory on its own thread, configured as Portico's inbound side is (poll()
 * internal threads, one daemon per core, suspend/resume allowed, 48 KiB of connection memory).
 * No routing, no headers read, no cache lookup, no logging or metrics.
 *
 *   mhd-answer PORT BODY_FILE [hold]
 *
 * With `hold` it is also the floor under requests that wait (bench/pace memory): a request for
 * /limited is suspended once its head is read and never resumed, so what the process grows per
 * held request is what libmicrohttpd alone keeps for a begun request (its connection and the
 * pages of its memory pool the request touched). Connections are then not limited or timed out.
 */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>

static char body[4096];
static size_t body_len;
static int hold;

static enum MHD_Result answer(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    (void)cls; (void)method; (void)version; (void)upload_data;
    if (*con_cls == NULL) { *con_cls = connection; return MHD_YES; }   /* head read: wait for the end */
    if (*upload_data_size != 0) { *upload_data_size = 0; return MHD_YES; }
    if (hold && strcmp(url, "/limited") == 0) { MHD_suspend_connection(connection); return MHD_YES; }
    struct MHD_Response *response = MHD_create_response_from_buffer(body_len, body, MHD_RESPMEM_PERSISTENT);
    if (response == NULL) return MHD_NO;
    MHD_add_response_header(response, "Content-Type", "application/json");
    enum MHD_Result queued = MHD_queue_response(connection, 200, response);
    MHD_destroy_response(response);
    return queued;
}

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 4 && strcmp(argv[3], "hold") == 0)) { fprintf(stderr, "usage: mhd-answer PORT BODY_FILE [hold]\n"); return 2; }
    hold = argc == 4;
    FILE *file = fopen(argv[2], "rb");
    if (file == NULL) { perror(argv[2]); return 1; }
    body_len = fread(body, 1, sizeof body, file);
    fclose(file);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    sigset_t set; sigemptyset(&set); sigaddset(&set, SIGTERM); sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    /* One daemon per thread on one port (SO_REUSEPORT), as Portico runs one daemon per thread. */
    for (long i = 0; i < (cores > 0 ? cores : 1); i++) {
        struct MHD_Daemon *daemon = MHD_start_daemon(
            MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME, (uint16_t)atoi(argv[1]), NULL, NULL,
            answer, NULL, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(48 * 1024), MHD_OPTION_CONNECTION_TIMEOUT, hold ? 0u : 60u,
            MHD_OPTION_CONNECTION_LIMIT, hold ? 20100u : (unsigned)(FD_SETSIZE - 4), MHD_OPTION_END);
        if (daemon == NULL) { fprintf(stderr, "MHD_start_daemon failed\n"); return 1; }
    }
    int signal_number; sigwait(&set, &signal_number);
    _exit(0);
}
