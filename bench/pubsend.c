/* A bench-only Tickertape publisher in C, so that the load generator is not what a publish
 * benchmark measures when it writes one frame per send (bench/pubsend.py builds and drives it).
 *
 *   pubsend HOST PORT FRAMES_FILE PER_SEND WINDOW CLIENT_NAME TIMEOUT_S
 *
 * FRAMES_FILE holds the publish frames, back to back, exactly as they go on the wire (4-byte
 * big-endian length, then header and body; bench/loadgen.py build_publish_frames), each asking
 * for the `persisted` ack. The sender logs on (a=processed), prints "ready" on stdout and
 * waits for a line on stdin (the caller reads the server's CPU there), then sends.
 *
 * Sending: at most WINDOW messages unacked; PER_SEND frames per send(2) (0: everything the
 * window allows in one send), TCP_NODELAY as uvloop sets it. While a burst is under way it
 * looks for acks without blocking every ACK_POLL sends; when the window is full it blocks on
 * the socket. The server's persisted acks are conflated: one carries the highest sequence
 * acknowledged, and covers every sequence up to it.
 *
 * At the end one JSON line on stdout: sent, acked, sends (send(2) calls made: equal to the
 * frame count at PER_SEND 1 unless a send was cut short), short_sends, errors, seconds (first
 * send to last ack), cpu (this process's user + system seconds over the same span),
 * timed_out, error (null or the first problem). Exit status 0 unless the arguments or the
 * connection failed before sending.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ACK_POLL 64

static int fd = -1;
static unsigned char rbuf[1 << 16];
static size_t rlen = 0;
static long long top_acked = 0;
static long long errors = 0;
static char first_error[512] = "";
static int logon_done = 0;
static long long logon_s = 0;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu_s(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec +
           r.ru_stime.tv_usec / 1e6;
}

static void note_error(const char *what, const unsigned char *p, size_t n) {
    errors++;
    if (!first_error[0]) {
        int m = n > 300 ? 300 : (int)n;
        snprintf(first_error, sizeof first_error, "%s: %.*s", what, m, (const char *)p);
        for (char *c = first_error; *c; c++)
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '\'';
    }
}

static long long member_int(const unsigned char *h, size_t n, const char *key) {
    const unsigned char *p = memmem(h, n, key, strlen(key));
    if (!p) return -1;
    p += strlen(key);
    long long v = 0;
    int any = 0;
    while (p < h + n && *p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        any = 1;
    }
    return any ? v : -1;
}

#define HAS(h, n, lit) (memmem((h), (n), (lit), sizeof(lit) - 1) != NULL)

/* One frame from the server (header only: acks carry no body). */
static void on_frame(const unsigned char *h, size_t n) {
    if (!HAS(h, n, "\"c\":\"ack\"")) return;
    if (HAS(h, n, "\"status\":\"failure\"")) {
        note_error("server failure", h, n);
        return;
    }
    if (!logon_done) {
        if (HAS(h, n, "\"cid\":\"logon\"")) {
            long long s = member_int(h, n, "\"s\":");
            logon_s = s > 0 ? s : 0;
            logon_done = 1;
        }
        return;
    }
    if (HAS(h, n, "\"a\":\"persisted\"")) {
        long long s = member_int(h, n, "\"s\":");
        if (s > top_acked) top_acked = s;
    }
}

/* Read what the socket holds (blocking: wait up to timeout_ms first). -1: closed or error. */
static int read_some(int timeout_ms) {
    if (timeout_ms >= 0) {
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, timeout_ms);
        if (r <= 0) return r < 0 && errno != EINTR ? -1 : 0;
    }
    ssize_t got = recv(fd, rbuf + rlen, sizeof rbuf - rlen, timeout_ms < 0 ? MSG_DONTWAIT : 0);
    if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    if (got == 0) return -1;
    rlen += (size_t)got;
    size_t pos = 0;
    while (rlen - pos >= 4) {
        uint32_t ln = (uint32_t)rbuf[pos] << 24 | (uint32_t)rbuf[pos + 1] << 16 |
                      (uint32_t)rbuf[pos + 2] << 8 | rbuf[pos + 3];
        if (ln > sizeof rbuf - 4) {
            note_error("server frame too large for the sender", rbuf + pos, 16);
            return -1;
        }
        if (rlen - pos - 4 < ln) break;
        on_frame(rbuf + pos + 4, ln);
        pos += 4 + ln;
    }
    memmove(rbuf, rbuf + pos, rlen - pos);
    rlen -= pos;
    return 1;
}

static long long short_sends = 0;

static int send_all(const unsigned char *p, size_t n, long long *sends) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        ++*sends;
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if ((size_t)w < n) short_sends++;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr,
                "usage: pubsend HOST PORT FRAMES_FILE PER_SEND WINDOW CLIENT_NAME TIMEOUT_S\n");
        return 2;
    }
    const char *host = argv[1], *port = argv[2], *path = argv[3], *name = argv[6];
    long per_send = atol(argv[4]), window = atol(argv[5]);
    double timeout = atof(argv[7]);

    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0) {
        perror(path);
        return 2;
    }
    unsigned char *buf = malloc(st.st_size + 1);
    if (fread(buf, 1, st.st_size, f) != (size_t)st.st_size) {
        perror(path);
        return 2;
    }
    fclose(f);
    /* frame offsets: offs[i] is where frame i (sequence i + 1) starts */
    size_t cap = 1024, n = 0;
    size_t *offs = malloc(cap * sizeof *offs);
    for (size_t pos = 0; pos < (size_t)st.st_size; n++) {
        if (n + 2 > cap) offs = realloc(offs, (cap *= 2) * sizeof *offs);
        offs[n] = pos;
        pos += 4 + ((size_t)buf[pos] << 24 | (size_t)buf[pos + 1] << 16 |
                    (size_t)buf[pos + 2] << 8 | buf[pos + 3]);
    }
    offs[n] = st.st_size;

    struct addrinfo hints = {0}, *ai;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &ai) != 0) {
        fprintf(stderr, "pubsend: cannot resolve %s:%s\n", host, port);
        return 2;
    }
    fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        perror("pubsend: connect");
        return 2;
    }
    freeaddrinfo(ai);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    char logon[512];
    int hl = snprintf(logon + 4, sizeof logon - 4,
                      "{\"c\":\"logon\",\"cid\":\"logon\",\"a\":\"processed\","
                      "\"client_name\":\"%s\"}",
                      name);
    logon[0] = logon[1] = 0;
    logon[2] = (char)(hl >> 8);
    logon[3] = (char)hl;
    long long dummy = 0;
    if (send_all((unsigned char *)logon, 4 + hl, &dummy) != 0) {
        perror("pubsend: send logon");
        return 2;
    }
    double t_logon = now_s();
    while (!logon_done && !errors) {
        if (now_s() - t_logon > 30 || read_some(1000) < 0) {
            fprintf(stderr, "pubsend: no logon ack\n");
            return 2;
        }
    }
    if (errors) {
        fprintf(stderr, "pubsend: logon failed: %s\n", first_error);
        return 2;
    }
    if (logon_s) {
        fprintf(stderr, "pubsend: publisher %s already has sequence %lld stored\n", name,
                logon_s);
        return 2;
    }
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;

    long long sent = 0, sends = 0, window_waits = 0;
    double window_wait_s = 0;
    int timed_out = 0, lost = 0;
    double cpu0 = cpu_s(), t0 = now_s(), deadline = t0 + timeout, t_end = 0;
    while (top_acked < (long long)n && !errors) {
        long long room = window - (sent - top_acked);
        if (room > 0 && sent < (long long)n) {
            long long j = sent + room < (long long)n ? sent + room : (long long)n;
            long long k = per_send > 0 ? per_send : j - sent;
            for (long long since = 0; sent < j;) {
                long long e = sent + k < j ? sent + k : j;
                if (send_all(buf + offs[sent], offs[e] - offs[sent], &sends) != 0) {
                    lost = 1;
                    break;
                }
                sent = e;
                if (++since == ACK_POLL) { /* let acks in without blocking */
                    since = 0;
                    if (read_some(-1) < 0) {
                        lost = 1;
                        break;
                    }
                    long long more = window - (sent - top_acked);
                    j = sent + more < (long long)n ? sent + more : (long long)n;
                }
            }
            if (lost) break;
            continue;
        }
        double t_wait = now_s(), left = deadline - t_wait;
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        window_waits++;
        int got = read_some((int)(left * 1000) + 1);
        window_wait_s += now_s() - t_wait;
        if (got < 0) {
            lost = 1;
            break;
        }
    }
    t_end = now_s();
    double cpu = cpu_s() - cpu0;
    if (lost && !first_error[0])
        snprintf(first_error, sizeof first_error, "connection lost: %s",
                 errno ? strerror(errno) : "closed by server");
    printf("{\"sent\":%lld,\"acked\":%lld,\"sends\":%lld,\"short_sends\":%lld,"
           "\"errors\":%lld,\"seconds\":%.6f,\"cpu\":%.6f,\"window_waits\":%lld,"
           "\"window_wait_s\":%.6f,\"timed_out\":%s,\"error\":",
           sent, top_acked, sends, short_sends, errors, t_end - t0, cpu, window_waits, window_wait_s,
           timed_out ? "true" : "false");
    if (first_error[0])
        printf("\"%s\"}\n", first_error);
    else
        printf("null}\n");
    fflush(stdout);
    close(fd);
    return 0;
}
