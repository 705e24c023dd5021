// progress.c: the progress line of `draftscope run` (ds/progress.h).
#include "ds/progress.h"

#include <time.h>
#include <unistd.h>

#define TTY_PERIOD 0.25  // seconds between redraws on a terminal
#define PLAIN_PERIOD 10.0 // seconds between plain lines

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void ds_progress_init(struct ds_progress *p, FILE *f, enum ds_progress_mode mode,
                      uint64_t total) {
    *p = (struct ds_progress){.f = f, .mode = mode, .total = total};
    if (p->mode == DS_PROGRESS_AUTO)
        p->mode = f && isatty(fileno(f)) ? DS_PROGRESS_TTY : DS_PROGRESS_PLAIN;
    if (!f) p->mode = DS_PROGRESS_QUIET;
    p->t_start = p->t_last = now_s();
}

static void hms(double s, char *buf, size_t cap) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, cap, "%lds", t);
}

const char *ds_progress_format(const struct ds_progress *p, double now, char *buf, size_t cap) {
    const double dt = now - p->t_start;
    const double tps = dt > 0 ? (double)p->tokens / dt : 0.0;
    char left[32];
    if (p->done > 0 && p->done <= p->total)
        hms(dt / (double)p->done * (double)(p->total - p->done), left, sizeof left);
    else
        snprintf(left, sizeof left, "?");
    if (p->steps > 0)
        snprintf(buf, cap, "B=%u: %llu/%llu requests, %.1f tokens/s, acceptance length %.2f, "
                 "%s left", p->batch, (unsigned long long)p->done, (unsigned long long)p->total,
                 tps, 1.0 + (double)p->accepted / (double)p->steps, left);
    else
        snprintf(buf, cap, "B=%u: %llu/%llu requests, %.1f tokens/s, %s left", p->batch,
                 (unsigned long long)p->done, (unsigned long long)p->total, tps, left);
    return buf;
}

void ds_progress_update(struct ds_progress *p, unsigned batch, uint64_t done, uint64_t tokens,
                        uint64_t steps, uint64_t accepted, int force) {
    p->batch = batch;
    p->done = done;
    p->tokens = tokens;
    p->steps = steps;
    p->accepted = accepted;
    if (p->mode == DS_PROGRESS_QUIET) return;
    const double now = now_s();
    const double period = p->mode == DS_PROGRESS_TTY ? TTY_PERIOD : PLAIN_PERIOD;
    if (!force && now - p->t_last < period) return;
    p->t_last = now;
    char line[256];
    ds_progress_format(p, now, line, sizeof line);
    if (p->mode == DS_PROGRESS_TTY) {
        fprintf(p->f, "\r\033[K%s", line); // carriage return, clear to the end of the line
        p->drawn = 1;
    } else {
        fprintf(p->f, "%s\n", line);
    }
    fflush(p->f);
}

void ds_progress_finish(struct ds_progress *p) {
    if (p->mode == DS_PROGRESS_TTY && p->drawn) {
        fputc('\n', p->f);
        fflush(p->f);
        p->drawn = 0;
    }
}
