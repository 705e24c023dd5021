// ds/progress.h: the progress line of `draftscope run` on stderr.
//
// On a terminal one line is redrawn in place (at most 4 times a second): batch size, requests
// done of the total, tokens/s, the running mean acceptance length (1 + accepted/steps) and an
// estimate of the time left. When stderr is not a terminal (a log file, CI) a plain line is
// printed at most every 10 seconds and at the end of each batch size. Quiet mode prints nothing.
// The clock is CLOCK_MONOTONIC; nothing here allocates after ds_progress_init.
#ifndef DS_PROGRESS_H
#define DS_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum ds_progress_mode {
    DS_PROGRESS_AUTO = 0,  // TTY when the stream is a terminal, else PLAIN
    DS_PROGRESS_TTY = 1,   // one line redrawn with \r
    DS_PROGRESS_PLAIN = 2, // a line every few seconds
    DS_PROGRESS_QUIET = 3, // nothing
};

struct ds_progress {
    FILE *f;
    enum ds_progress_mode mode; // resolved (never AUTO after init)
    double t_start, t_last;     // seconds, CLOCK_MONOTONIC
    uint64_t total;             // requests of the whole run (all batch sizes)
    uint64_t done;              // requests finished (or skipped) so far
    uint64_t tokens;            // tokens generated so far
    uint64_t steps, accepted;   // verify steps that drafted, and accepted drafts so far
    unsigned batch;             // the batch size being replayed
    int drawn;                  // a TTY line is on screen
};

// Starts the clock. total: requests to replay over the whole run.
void ds_progress_init(struct ds_progress *p, FILE *f, enum ds_progress_mode mode,
                      uint64_t total);

// Adds what happened since the last call and redraws if it is time (force: now).
void ds_progress_update(struct ds_progress *p, unsigned batch, uint64_t done, uint64_t tokens,
                        uint64_t steps, uint64_t accepted, int force);

// Ends the line (TTY) so that later output starts on a fresh line.
void ds_progress_finish(struct ds_progress *p);

// Formats the line into buf (what update prints, without \r or \n); returns buf.
const char *ds_progress_format(const struct ds_progress *p, double now, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif // DS_PROGRESS_H
