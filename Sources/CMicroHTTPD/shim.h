#ifndef PORTICO_CMICROHTTPD_SHIM_H
#define PORTICO_CMICROHTTPD_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <stdarg.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h> /* HangUpWatch: suspended connections watched for their clients leaving */
#include <microhttpd.h>

/* MHD's error log takes a va_list: format it here and hand Swift a plain string. */
typedef void (*portico_log_sink)(void *cls, const char *message);
struct portico_log_target { portico_log_sink sink; void *context; };

static inline void portico_mhd_log_trampoline(void *cls, const char *fmt, va_list ap) {
    struct portico_log_target *target = (struct portico_log_target *)cls;
    char buffer[1024];
    vsnprintf(buffer, sizeof buffer, fmt, ap);
    if (target != NULL && target->sink != NULL) target->sink(target->context, buffer);
}


/* Enum constants whose imported Swift spelling is unclear: re-exported with stable names. */
static const enum MHD_ConnectionNotificationCode portico_notify_started = MHD_CONNECTION_NOTIFY_STARTED;
static const enum MHD_ConnectionNotificationCode portico_notify_closed = MHD_CONNECTION_NOTIFY_CLOSED;
static const enum MHD_ResponseMemoryMode portico_respmem_must_copy = MHD_RESPMEM_MUST_COPY;
static const enum MHD_ValueKind portico_header_kind = MHD_HEADER_KIND;
static const enum MHD_Result portico_yes = MHD_YES;
static const enum MHD_Result portico_no = MHD_NO;
static const enum MHD_FEATURE portico_feature_tls = MHD_FEATURE_TLS;

/* MHD_OPTION_URI_LOG_CALLBACK's callback: its result becomes the request's *con_cls. */
typedef void *(*portico_uri_log_callback)(void *cls, const char *uri, struct MHD_Connection *con);

/*
 * MHD_start_daemon is variadic and Swift cannot call C variadics. Every option
 * Portico sets is gathered in this struct and passed through MHD_OPTION_ARRAY.
 */
struct portico_mhd_config {
    unsigned int flags;                       /* one internal thread; with MHD_USE_NO_LISTEN_SOCKET connections come from MHD_add_connection */
    unsigned int connection_limit;
    unsigned int connection_timeout_seconds;  /* idle timeout, 0 = none */
    size_t connection_memory_limit;           /* per-connection buffer for the head and body chunks */
    int strict_level;                         /* MHD_OPTION_STRICT_FOR_CLIENT */
    MHD_AccessHandlerCallback access_handler;
    void *access_context;
    portico_uri_log_callback uri_log_callback;
    void *uri_log_context;
    MHD_RequestCompletedCallback completed_callback;
    void *completed_context;
    MHD_NotifyConnectionCallback connection_callback;
    void *connection_context;
    /* MHD's own error messages; NULL: stderr */
    struct portico_log_target *log_target;
    /* TLS (flags must include MHD_USE_TLS): NUL-terminated PEM kept alive by the caller for the
       daemon's lifetime; GnuTLS priority string. All NULL for plain HTTP. */
    const char *tls_cert_pem;
    const char *tls_key_pem;
    const char *tls_priorities;
};

static inline struct MHD_Daemon *portico_mhd_start(const struct portico_mhd_config *c) {
    struct MHD_OptionItem opts[20];
    int n = 0;
    /* The logger must come first, or MHD reports option errors on stderr before it is set. */
    if (c->log_target != NULL)
        opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)&portico_mhd_log_trampoline, c->log_target };
    opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_LIMIT, c->connection_limit, NULL };
    opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_TIMEOUT, c->connection_timeout_seconds, NULL };
    opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)c->connection_memory_limit, NULL };
    opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_STRICT_FOR_CLIENT, c->strict_level, NULL };
    if (c->uri_log_callback != NULL)
        opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)c->uri_log_callback, c->uri_log_context };
    if (c->completed_callback != NULL)
        opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)c->completed_callback, c->completed_context };
    if (c->connection_callback != NULL)
        opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)c->connection_callback, c->connection_context };
    if (c->tls_cert_pem != NULL)
        opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)c->tls_cert_pem };
    if (c->tls_key_pem != NULL)
        opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)c->tls_key_pem };
    if (c->tls_priorities != NULL)
        opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)c->tls_priorities };
    opts[n++] = (struct MHD_OptionItem){ MHD_OPTION_END, 0, NULL };
    return MHD_start_daemon(c->flags, 0, NULL, NULL,
                            c->access_handler, c->access_context,
                            MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
}

/* MHD_get_daemon_info and MHD_get_connection_info return unions: flatten them. */
static inline unsigned int portico_mhd_current_connections(struct MHD_Daemon *d) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return info == NULL ? 0 : info->num_connections;
}

/* Writes the client's address as text into buf; returns 0 on success. */
static inline int portico_mhd_client_address(struct MHD_Connection *c, char *buf, size_t len) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info == NULL || info->client_addr == NULL) return -1;
    const struct sockaddr *sa = info->client_addr;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return inet_ntop(AF_INET, &in->sin_addr, buf, (socklen_t)len) == NULL ? -1 : 0;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        return inet_ntop(AF_INET6, &in6->sin6_addr, buf, (socklen_t)len) == NULL ? -1 : 0;
    }
    return -1;
}


/* The per-connection context set by MHD_OPTION_NOTIFY_CONNECTION. */
static inline void *portico_mhd_socket_context(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info == NULL ? NULL : info->socket_context;
}

/* The connection's socket, or -1. */
static inline int portico_mhd_connection_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info == NULL ? -1 : info->connect_fd;
}

/* Whether libmicrohttpd has read this request's whole head (its size is known from then on). */
static inline int portico_mhd_head_received(struct MHD_Connection *c) {
    return MHD_get_connection_info(c, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE) != NULL;
}

/* Whether a response is queued on the connection. */
static inline int portico_mhd_has_response(struct MHD_Connection *c) {
    return MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS) != NULL;
}

/* MHD_set_response_options is variadic. */
static inline enum MHD_Result portico_mhd_set_response_flags(struct MHD_Response *r, enum MHD_ResponseFlags flags) {
    return MHD_set_response_options(r, flags, MHD_RO_END);
}

/* A content reader that is never asked for content: used for HEAD responses, which carry the
   Content-Length of the body they do not send. */
static inline ssize_t portico_mhd_no_content(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)cls; (void)pos; (void)buf; (void)max;
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

/* A streamed response: MHD_SIZE_UNKNOWN (a macro Swift does not import) for no declared length,
   sent chunked to HTTP/1.1 clients. */
static inline struct MHD_Response *portico_mhd_create_stream_response(int has_length, uint64_t length, size_t block,
                                                                       MHD_ContentReaderCallback reader, void *cls,
                                                                       MHD_ContentReaderFreeCallback release) {
    return MHD_create_response_from_callback(has_length ? length : MHD_SIZE_UNKNOWN, block, reader, cls, release);
}
static const ssize_t portico_reader_end = MHD_CONTENT_READER_END_OF_STREAM;
static const ssize_t portico_reader_error = MHD_CONTENT_READER_END_WITH_ERROR;
static const enum MHD_RequestTerminationCode portico_completed_ok = MHD_REQUEST_TERMINATED_COMPLETED_OK;

static inline struct MHD_Response *portico_mhd_create_head_response(uint64_t content_length) {
    return MHD_create_response_from_callback(content_length, 4096, &portico_mhd_no_content, NULL, NULL);
}

/* Upgrade (issue #35): the 101 response that hands the connection over, and the one way to
   give it back. libmicrohttpd owns the upgraded socket (on a TLS listener, one end of the
   socketpair it relays through): the application never close()s it, it calls
   MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE) once, and libmicrohttpd closes it on its thread. */
static const enum MHD_FEATURE portico_feature_upgrade = MHD_FEATURE_UPGRADE;
static const unsigned int portico_allow_upgrade = MHD_ALLOW_UPGRADE;
static inline enum MHD_Result portico_mhd_upgrade_close(struct MHD_UpgradeResponseHandle *urh) {
    return MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
}

/* The TLS relay's buffers. libmicrohttpd 0.9.75 to 0.9.77 (Debian 12 ships 0.9.75) relay an
   upgraded TLS connection through buffers carved from the connection's memory pool, but only
   after the reply head's write buffer took every free byte of it: the relay falls back to its
   8-byte emergency buffer and moves 4 bytes each way per poll() round (a 16 MiB message over
   TLS took minutes under load). Fixed upstream in 1.0.0 ("Upgraded TLS: fixed inefficient
   communication", which frees the write buffer first). For those versions only, the upgrade
   callback (on the daemon thread, before libmicrohttpd's first relay round: nothing else reads
   the handle yet) points the handle at larger buffers of ours.

   `portico_mhd_urh_0_9_75` mirrors `struct MHD_UpgradeResponseHandle` of those versions'
   src/microhttpd/internal.h, built with HTTPS and epoll support as every Linux build is. Before
   touching anything, the mirror is verified against what the callback was given: the handle's
   connection, both back-pointers to the handle, the application socket and empty buffers. A
   different layout fails those checks and the handle is left alone. */
struct portico_mhd_urh_epoll_0_9_75 {
    struct MHD_UpgradeResponseHandle *urh;
    int socket;
    int celi;
};
struct portico_mhd_urh_0_9_75 {
    struct MHD_Connection *connection;
    void *next, *prev, *nextE, *prevE;
    _Bool in_eready_list;
    char *in_buffer, *out_buffer;
    size_t in_buffer_size, out_buffer_size, in_buffer_used, out_buffer_used;
    struct portico_mhd_urh_epoll_0_9_75 app, mhd;
    char e_buf[8];
};

/* The relay's buffer size each way, or -1 where the layout is not the verified one. */
static inline long portico_mhd_tls_relay_size(struct MHD_UpgradeResponseHandle *urh, struct MHD_Connection *c,
                                              int app_socket) {
    const char *v = MHD_get_version();
    if (v == NULL || (strcmp(v, "0.9.75") != 0 && strcmp(v, "0.9.76") != 0 && strcmp(v, "0.9.77") != 0)) return -1;
    struct portico_mhd_urh_0_9_75 *h = (struct portico_mhd_urh_0_9_75 *)urh;
    if (h->connection != c || h->app.urh != urh || h->mhd.urh != urh || h->app.socket != app_socket) return -1;
    return (long)h->in_buffer_size;
}

/* Gives the relay `each_way` bytes each way when it has less, right after the upgrade. Returns
   the relay's size each way afterwards (-1 where the layout is not the verified one), and in
   `block` what to free once libmicrohttpd has freed the handle (the connection's close
   notification comes after that), or NULL when nothing was changed. */
static inline long portico_mhd_widen_tls_relay(struct MHD_UpgradeResponseHandle *urh, struct MHD_Connection *c,
                                               int app_socket, size_t each_way, void **block) {
    *block = NULL;
    long size = portico_mhd_tls_relay_size(urh, c, app_socket);
    struct portico_mhd_urh_0_9_75 *h = (struct portico_mhd_urh_0_9_75 *)urh;
    if (size < 0 || (size_t)size >= each_way || h->out_buffer_size >= each_way
        || h->in_buffer_used != 0 || h->out_buffer_used != 0) return size;
    char *buffers = malloc(2 * each_way);
    if (buffers == NULL) return size;
    h->in_buffer = buffers;
    h->out_buffer = buffers + each_way;
    h->in_buffer_size = each_way;
    h->out_buffer_size = each_way;
    *block = buffers;
    return (long)each_way;
}

#endif
