/*
 * Request deadlines: a request's headers and body must arrive within
 * --timeout seconds of the connection opening (or of the previous request
 * on it ending), however the client spaces its bytes.
 *
 * libmicrohttpd's connection timeout counts idle time only, so a client that
 * sends one byte a second never trips it and holds a connection thread for
 * ever. Here every connection has a slot (MHD's connection notifications
 * fill and empty it); a watchdog thread wakes four times a second and shuts
 * down the socket of any connection whose request is still arriving past its
 * deadline. libmicrohttpd's own thread for it then reads end-of-file and
 * closes the connection. The slot is emptied (under the lock) before
 * libmicrohttpd closes the descriptor, so a number the kernel reuses is
 * never shut down by mistake.
 */
#include "serve/serve_impl.h"

#include "core/core.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

struct serve_deadlines {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double timeout;
    int n, stop;
    struct {
        int fd;       /* -1: free */
        int arriving; /* a request's headers or body are on their way */
        int shut;
        double since;
    } *c;
    pthread_t thread;
};

static void *watch(void *arg) {
    serve_deadlines *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        double now = whale_now();
        for (int i = 0; i < d->n; i++)
            if (d->c[i].fd >= 0 && d->c[i].arriving && !d->c[i].shut && now - d->c[i].since > d->timeout) {
                shutdown(d->c[i].fd, SHUT_RDWR);
                d->c[i].shut = 1;
            }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        while (!d->stop && pthread_cond_timedwait(&d->cv, &d->mu, &ts) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

whale_code serve_deadlines_start(int n, double timeout, serve_deadlines **out, whale_err *err) {
    serve_deadlines *d = calloc(1, sizeof *d);
    if (d) d->c = malloc(sizeof *d->c * (size_t)n);
    if (!d || !d->c) {
        free(d);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for %d connections", n);
    }
    d->n = n;
    d->timeout = timeout;
    for (int i = 0; i < n; i++) d->c[i].fd = -1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    if (pthread_create(&d->thread, NULL, watch, d)) {
        pthread_cond_destroy(&d->cv);
        pthread_mutex_destroy(&d->mu);
        free(d->c);
        free(d);
        return whale_errf(err, WHALE_ERR_INTERNAL, "cannot start the request deadline thread");
    }
    *out = d;
    return WHALE_OK;
}

void serve_deadlines_stop(serve_deadlines *d) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d->c);
    free(d);
}

void serve_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode toe) {
    serve_deadlines *d = ((serve_server *)cls)->deadlines;
    pthread_mutex_lock(&d->mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        int i = 0;
        while (i < d->n && d->c[i].fd >= 0) i++;
        /* libmicrohttpd admits at most max_connections = n: a slot is free */
        if (ci && i < d->n) {
            d->c[i].fd = ci->connect_fd;
            d->c[i].arriving = 1;
            d->c[i].shut = 0;
            d->c[i].since = whale_now();
            *socket_context = (void *)(intptr_t)(i + 1);
        }
    } else if (*socket_context) {
        d->c[(intptr_t)*socket_context - 1].fd = -1;
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&d->mu);
}

/* The slot of connection c, or -1. */
static int slot_of(const serve_deadlines *d, struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    intptr_t i = ci ? (intptr_t)ci->socket_context : 0;
    return i > 0 && i <= d->n ? (int)i - 1 : -1;
}

void serve_deadline_set(serve_deadlines *d, struct MHD_Connection *c, int arriving) {
    pthread_mutex_lock(&d->mu);
    int i = slot_of(d, c);
    if (i >= 0) {
        d->c[i].arriving = arriving;
        d->c[i].since = whale_now();
    }
    pthread_mutex_unlock(&d->mu);
}
