// replay.c: continuous batching over a dataset at each batch size of a sweep (ds/replay.h).
//
// Per batch size B: slots 0..B-1 hold the live sequences. One iteration admits newcomers into
// free slots (rendering a dependent turn first), prefills them together (ds_spec_prefill), ends
// those whose first token already stops them or leaves them at the context limit, and admits
// again into the slots those freed, then runs one speculative step over every live sequence
// (ds_spec_step), appends its /steps and /drafts rows, and commits the emitted tokens one by one
// through the harmony channel tracker, cutting them at a stop token or max-new-tokens; a
// sequence the step left at the context limit ends there, so that its slot is refilled before
// the next step (B sequences stay in flight while requests remain).
#include "ds/replay.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FLUSH_PERIOD 1.0 // seconds between recorder flushes

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// ---------------------------------------------------------------------------------------------
// Preparation

void ds_replay_work_free(struct ds_replay_work *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++)
        ds_token_vec_free(&w->req[i].prompt);
    free(w->req);
    memset(w, 0, sizeof *w);
}

enum ds_status ds_replay_prepare(const ds_dataset_t *ds, ds_harmony_t *h,
                                 const struct ds_harmony_system *sys, int reply_estimate,
                                 struct ds_replay_work *w) {
    memset(w, 0, sizeof *w);
    const size_t n = ds_dataset_num_requests(ds);
    if (n == 0) return DS_OK;
    w->req = calloc(n, sizeof *w->req);
    if (!w->req) return ds_error_set(DS_ERR_NOMEM, "replay: out of memory for %zu requests", n);
    w->n = n;
    struct ds_chat_message *msgs = NULL;
    size_t msgs_cap = 0;
    enum ds_status s = DS_OK;
    for (size_t i = 0; i < n && s == DS_OK; i++) {
        struct ds_dataset_turn t;
        if ((s = ds_dataset_request(ds, i, &t))) break;
        struct ds_replay_request *r = &w->req[i];
        r->request_index = i;
        r->conversation = t.conversation;
        r->dataset_index = (uint32_t)t.conv->dataset_index;
        r->turn = (uint16_t)(t.turn - 1);
        r->category = t.conv->category ? t.conv->category : "";
        r->conv_id = t.conv->id ? t.conv->id : "";
        if (t.n_messages > w->max_messages) w->max_messages = t.n_messages;
        int missing = 0;
        for (size_t m = 0; m < t.n_messages; m++)
            missing += t.messages[m].text == NULL;
        if (!missing) {
            s = ds_dataset_render(ds, h, sys, &t, 0, &r->prompt);
            r->est_len = (int)r->prompt.n;
        } else {
            // Estimate: rendered with empty replies, plus reply_estimate tokens per reply.
            if (msgs_cap < t.n_messages) {
                struct ds_chat_message *nm = realloc(msgs, t.n_messages * sizeof *msgs);
                if (!nm) {
                    s = ds_error_set(DS_ERR_NOMEM, "replay: out of memory");
                    break;
                }
                msgs = nm;
                msgs_cap = t.n_messages;
            }
            for (size_t m = 0; m < t.n_messages; m++) {
                msgs[m] = t.messages[m];
                if (!msgs[m].text) msgs[m].text = "", msgs[m].len = 0;
            }
            struct ds_token_vec tmp = {0};
            s = ds_harmony_render_prompt(h, sys, msgs, t.n_messages, &tmp);
            r->est_len = (int)tmp.n + missing * reply_estimate;
            ds_token_vec_free(&tmp);
            r->needs_reply = true;
        }
        if (r->est_len > w->max_est_len) w->max_est_len = r->est_len;
    }
    free(msgs);
    if (s != DS_OK) ds_replay_work_free(w);
    return s;
}

// ---------------------------------------------------------------------------------------------
// The loop

enum req_state { R_WAIT = 0, R_RUNNING, R_DONE };

struct live {
    bool used;
    size_t req;
    struct ds_spec_seq seq;
    int32_t *gen;    // (max_new) generated ids
    int n_gen;
    int32_t *fin;    // (max_new) final-channel ids (the reply of a dependent turn)
    int n_fin;
    uint32_t steps;
    uint64_t start_ns;
    uint32_t id;     // request id in the file
    bool record;
};

struct replay {
    ds_spec_t *sp;
    ds_harmony_t *h;
    const ds_tokenizer_t *tok;
    const ds_dataset_t *ds;
    struct ds_replay_work *w;
    const struct ds_replay_config *cfg;
    ds_recorder_t *rec;
    const struct ds_resume_info *resume;
    uint64_t *done_keys; // resume: (B, dataset index, turn) of every done request, sorted
    size_t n_done_keys;
    struct ds_replay_stats *st;
    int S, P, K, max_new;
    uint32_t B;
    uint64_t step_id;
    uint32_t next_request;
    double t_flush;
    uint64_t done_total; // for progress: requests ended (any B)
    // per run
    struct live *live;         // (S)
    uint8_t *state, *run, *record; // (n)
    struct ds_byte_vec *reply; // (n) final text of each request at this B
    struct ds_chat_message *msgs; // (max_messages)
    struct ds_spec_seq **seqp, **newp; // (S)
    int32_t *slot_of;          // (S) index -> slot of the step
    const int32_t **prompts;   // (S)
    int *lens;                 // (S)
    struct ds_spec_result *res;  // (S)
    struct ds_rec_step *srows;   // (S)
    struct ds_rec_draft *drows;  // (S·K)
    // /requests rows of the requests that end inside a step, appended after that step's /steps
    // and /drafts rows: a flush between them (a full buffer, a crash) must never leave a
    // request recorded as done without its last rows, which --resume would then never rerun.
    struct ds_rec_request *qrows; // (S)
    size_t n_qrows;
    bool defer_requests;
    size_t cursor;             // first request index that may still wait
};

// One 64-bit key per (batch size, dataset index, turn): 16 + 32 + 16 bits.
static uint64_t done_key(uint32_t B, uint32_t dataset_index, uint32_t turn) {
    return (uint64_t)(B & 0xffff) << 48 | (uint64_t)dataset_index << 16 | (turn & 0xffff);
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

// The done requests' keys, sorted once: a lookup per request and batch size is then a binary
// search (a scan of every done row was quadratic on the resume of a large run).
static enum ds_status index_done(struct replay *r) {
    const size_t n = r->resume ? r->resume->n_done : 0;
    if (!n) return DS_OK;
    if (!(r->done_keys = malloc(n * sizeof *r->done_keys)))
        return ds_error_set(DS_ERR_NOMEM, "replay: out of memory");
    for (size_t i = 0; i < n; i++) {
        const struct ds_rec_request *d = &r->resume->done[i];
        r->done_keys[i] = done_key(d->batch_size, d->dataset_index, d->turn);
    }
    qsort(r->done_keys, n, sizeof *r->done_keys, cmp_u64);
    r->n_done_keys = n;
    return DS_OK;
}

static bool is_done(const struct replay *r, uint32_t B, const struct ds_replay_request *q) {
    if (!r->n_done_keys) return false;
    const uint64_t k = done_key(B, q->dataset_index, q->turn);
    return bsearch(&k, r->done_keys, r->n_done_keys, sizeof k, cmp_u64) != NULL;
}

// Which requests run at B and which of them are recorded.
static void plan_batch(struct replay *r, uint32_t B) {
    const size_t n = r->w->n;
    for (size_t i = 0; i < n; i++) {
        const bool done = is_done(r, B, &r->w->req[i]);
        r->run[i] = !done;
        r->record[i] = !done;
        r->state[i] = R_WAIT;
        r->reply[i].n = 0;
        if (r->reply[i].data) r->reply[i].data[0] = 0;
    }
    // A dependent turn that runs needs its earlier turns' replies: rerun them unrecorded.
    for (size_t i = n; i-- > 0;) {
        const struct ds_replay_request *q = &r->w->req[i];
        if (r->run[i] && q->needs_reply && q->turn > 0) r->run[i - 1] = 1;
    }
    r->cursor = 0;
}

static enum ds_rec_stop stop_of(enum ds_stop s) {
    switch (s) {
    case DS_STOP_RETURN: return DS_REC_STOP_RETURN;
    case DS_STOP_CALL: return DS_REC_STOP_CALL;
    default: return DS_REC_STOP_ENDOFTEXT;
    }
}

static void progress(struct replay *r, int force) {
    if (r->cfg->progress)
        ds_progress_update(r->cfg->progress, r->B, r->done_total, r->st->tokens,
                           r->st->drafted_steps, r->st->accepted, force);
}

// Ends the request in slot `slot`.
static enum ds_status finish(struct replay *r, int slot, enum ds_rec_stop stop) {
    struct live *l = &r->live[slot];
    const struct ds_replay_request *q = &r->w->req[l->req];
    enum ds_status s = DS_OK;
    if (l->record) {
        struct ds_rec_request row = {0};
        uint64_t now = 0;
        uint32_t cat = 0, conv = 0;
        if ((s = ds_recorder_elapsed_ns(r->rec, &now)) ||
            (s = ds_recorder_intern(r->rec, q->category, &cat)) ||
            (s = ds_recorder_intern(r->rec, q->conv_id, &conv)))
            return s;
        row.start_ns = l->start_ns;
        row.end_ns = now;
        row.request = l->id;
        row.dataset_index = q->dataset_index;
        row.category = cat;
        row.conversation = conv;
        row.prompt_len = (uint32_t)q->prompt.n;
        row.generated_len = (uint32_t)l->n_gen;
        row.steps = l->steps;
        row.batch_size = (uint16_t)r->B;
        row.turn = q->turn;
        row.stop_reason = (uint8_t)stop;
        if (r->defer_requests) r->qrows[r->n_qrows++] = row; // at most one per slot and step
        else if ((s = ds_recorder_append_requests(r->rec, &row, 1))) return s;
        r->st->requests++;
        r->st->errors += stop == DS_REC_STOP_ERROR;
    }
    // The reply a later turn of a question conversation is rendered with.
    if (l->req + 1 < r->w->n && r->w->req[l->req + 1].needs_reply && r->tok) {
        struct ds_byte_vec *rv = &r->reply[l->req];
        rv->n = 0;
        // As text: a reply cut inside a character (max-new-tokens) or holding invalid UTF-8
        // would make the harmony render of the next turn refuse it.
        if ((s = ds_tokenizer_decode_text(r->tok, l->fin, (size_t)l->n_fin, rv))) return s;
    }
    if (r->cfg->on_finish)
        r->cfg->on_finish(r->cfg->user, q, r->B, l->gen, (size_t)l->n_gen, stop);
    r->state[l->req] = R_DONE;
    l->used = false;
    r->done_total++;
    progress(r, 0);
    return DS_OK;
}

// Commits one generated token: feeds the tracker, checks the stops. *ended set when finished.
static enum ds_status commit_token(struct replay *r, int slot, int32_t id, bool *ended) {
    struct live *l = &r->live[slot];
    enum ds_stop stop = DS_STOP_NONE;
    enum ds_channel ch = ds_channel_tracker_feed(&l->seq.tracker, id, &stop);
    l->gen[l->n_gen++] = id;
    if (ch == DS_CHANNEL_FINAL && stop == DS_STOP_NONE && !ds_tokenizer_is_special(r->tok, id))
        l->fin[l->n_fin++] = id;
    r->st->tokens++;
    *ended = true;
    if (stop != DS_STOP_NONE) return finish(r, slot, stop_of(stop));
    if (l->n_gen >= r->max_new) return finish(r, slot, DS_REC_STOP_MAX_NEW_TOKENS);
    *ended = false;
    return DS_OK;
}

// Renders a dependent turn with the replies generated at this B.
static enum ds_status render_dependent(struct replay *r, size_t i) {
    struct ds_replay_request *q = &r->w->req[i];
    struct ds_dataset_turn t;
    enum ds_status s = ds_dataset_request(r->ds, i, &t);
    if (s) return s;
    size_t k = 0; // the k-th missing reply is the reply of turn k+1 of this conversation
    for (size_t m = 0; m < t.n_messages; m++) {
        r->msgs[m] = t.messages[m];
        if (!r->msgs[m].text) {
            // Past the earlier turns it would read another conversation's reply.
            char name[DS_CONVERSATION_NAME_CAP];
            if (k + 1 >= t.turn)
                return ds_error_set(DS_ERR_ARG, "%s: %s turn %zu: more replies to fill than "
                                    "earlier turns", ds_dataset_path(r->ds),
                                    ds_conversation_name(t.conv, name, sizeof name), t.turn);
            const struct ds_byte_vec *rv = &r->reply[t.conv->first_request + k++];
            r->msgs[m].text = rv->data ? rv->data : "";
            r->msgs[m].len = rv->n;
        }
    }
    q->prompt.n = 0;
    return ds_harmony_render_prompt(r->h, r->cfg->sys, r->msgs, t.n_messages, &q->prompt);
}

// The next request that may start now, or -1.
static long next_admissible(struct replay *r) {
    while (r->cursor < r->w->n && (r->state[r->cursor] == R_DONE || !r->run[r->cursor]))
        r->cursor++;
    for (size_t i = r->cursor; i < r->w->n; i++) {
        if (!r->run[i] || r->state[i] != R_WAIT) continue;
        const struct ds_replay_request *q = &r->w->req[i];
        if (q->needs_reply && q->turn > 0 && r->state[i - 1] != R_DONE) continue;
        return (long)i;
    }
    return -1;
}

static bool any_waiting(const struct replay *r) {
    for (size_t i = r->cursor; i < r->w->n; i++)
        if (r->run[i] && r->state[i] == R_WAIT) return true;
    return false;
}

// A sequence whose bonus sits at the last position cannot step: it ends at the context limit.
static bool at_limit(const struct replay *r, const struct live *l) {
    return l->seq.committed > r->P - 2;
}

// Fills free slots and prefills the newcomers (one round). Returns the number admitted.
static enum ds_status admit_once(struct replay *r, int *admitted) {
    *admitted = 0;
    int n_new = 0;
    enum ds_status s;
    for (uint32_t slot = 0; slot < r->B; slot++) {
        if (r->live[slot].used) continue;
        long i;
        while ((i = next_admissible(r)) >= 0) {
            struct ds_replay_request *q = &r->w->req[i];
            if (q->needs_reply && (s = render_dependent(r, (size_t)i))) return s;
            if (q->prompt.n >= (size_t)r->P || q->prompt.n == 0) {
                char name[DS_CONVERSATION_NAME_CAP];
                if (r->cfg->log)
                    fprintf(r->cfg->log,
                            "%s: %s turn %u: prompt of %zu tokens does not fit the context limit "
                            "of %d positions; skipped\n", ds_dataset_path(r->ds),
                            ds_conversation_name(ds_dataset_conversation(r->ds, q->conversation),
                                                 name, sizeof name),
                            q->turn + 1, q->prompt.n, r->P);
                r->state[i] = R_DONE;
                r->st->skipped++;
                r->done_total++;
                continue;
            }
            break;
        }
        if (i < 0) break;
        struct ds_replay_request *q = &r->w->req[i];
        struct live *l = &r->live[slot];
        l->used = true;
        l->req = (size_t)i;
        l->n_gen = l->n_fin = 0;
        l->steps = 0;
        l->record = r->record[i];
        l->id = l->record ? r->next_request++ : UINT32_MAX;
        if ((s = ds_recorder_elapsed_ns(r->rec, &l->start_ns))) return s;
        memset(&l->seq, 0, sizeof l->seq);
        l->seq.slot = (int32_t)slot;
        l->seq.key = q->request_index;
        ds_channel_tracker_init(&l->seq.tracker, r->h, DS_TRACKER_AFTER_PROMPT);
        r->state[i] = R_RUNNING;
        r->newp[n_new] = &l->seq;
        r->prompts[n_new] = q->prompt.ids;
        r->lens[n_new] = (int)q->prompt.n;
        r->slot_of[n_new++] = (int32_t)slot;
    }
    if (n_new == 0) return DS_OK;
    ds_spec_set_trace(r->sp, r->cfg->trace, r->step_id); // prefill: the step that admits it
    if ((s = ds_spec_prefill(r->sp, n_new, r->newp, r->prompts, r->lens))) return s;
    for (int j = 0; j < n_new; j++) {
        const int slot = r->slot_of[j];
        struct live *l = &r->live[slot];
        if (l->seq.nonfinite) {
            if ((s = finish(r, slot, DS_REC_STOP_ERROR))) return s;
            continue;
        }
        bool ended;
        if ((s = commit_token(r, slot, l->seq.bonus, &ended))) return s;
        if (!ended && at_limit(r, l) && (s = finish(r, slot, DS_REC_STOP_CONTEXT_LIMIT)))
            return s;
    }
    *admitted = n_new;
    return DS_OK;
}

// Fills free slots and prefills the newcomers, until the slots are full or nothing can start:
// a newcomer that ends at once (its first token stops it, or leaves it at the context limit)
// frees its slot for the next request. Returns the number admitted.
static enum ds_status admit(struct replay *r, int *admitted) {
    *admitted = 0;
    for (;;) {
        int n;
        enum ds_status s = admit_once(r, &n);
        if (s) return s;
        if (n == 0) return DS_OK;
        *admitted += n;
    }
}

static enum ds_status maybe_flush(struct replay *r, int force) {
    const double t = now_s();
    if (!force && t - r->t_flush < FLUSH_PERIOD) return DS_OK;
    r->t_flush = t;
    return ds_recorder_flush(r->rec);
}

// One step over every live sequence; records and commits.
static enum ds_status step(struct replay *r) {
    enum ds_status s;
    // No live sequence is at the context limit here: admit and the last step ended those.
    int n = 0;
    for (uint32_t slot = 0; slot < r->B; slot++)
        if (r->live[slot].used) {
            r->seqp[n] = &r->live[slot].seq;
            r->slot_of[n++] = (int32_t)slot;
        }
    if (n == 0) return DS_OK;
    ds_spec_set_trace(r->sp, r->cfg->trace, r->step_id);
    if ((s = ds_spec_step(r->sp, n, r->seqp, r->res))) return s;
    const uint64_t step_id = r->step_id++;
    // Phase times of this step (its prefill included): polled here, on the recorder's thread,
    // once the step's results are downloaded (the phase events have finished). The poll reads
    // CUPTI's kernel records lazily; the caller's final ds_trace_collect gathers the rest.
    const struct ds_trace_step_times *tt = NULL;
    if (r->cfg->trace) {
        const struct ds_trace_step_times *times;
        size_t nt;
        if ((s = ds_trace_poll(r->cfg->trace, &times, &nt))) return s;
        for (size_t i = 0; i < nt; i++)
            if (times[i].step == step_id) tt = &times[i];
    }
    size_t nd = 0, ns = 0;
    r->defer_requests = true;
    r->n_qrows = 0;
    for (int i = 0; i < n; i++) {
        const int slot = r->slot_of[i];
        struct live *l = &r->live[slot];
        const struct ds_spec_result *res = &r->res[i];
        const struct ds_replay_request *q = &r->w->req[l->req];
        l->steps++;
        // Commit the emitted tokens in order, cut at a stop token or max-new-tokens.
        int emitted = 0;
        bool ended = false;
        for (int j = 0; j < res->n_emitted && !ended; j++) {
            if ((s = commit_token(r, slot, res->emitted[j], &ended))) return s;
            emitted++;
        }
        if (l->record) {
            struct ds_rec_step *sr = &r->srows[ns++];
            memset(sr, 0, sizeof *sr);
            sr->step = step_id;
            sr->request = l->id;
            sr->context_len = res->context_len;
            sr->batch_size = (uint16_t)n;
            sr->turn = q->turn;
            sr->drafted = (uint8_t)res->drafted;
            sr->accepted = (uint8_t)res->accepted;
            sr->emitted = (uint8_t)emitted;
            sr->nonfinite = res->nonfinite;
            memcpy(sr->distinct_experts, res->distinct_experts, sizeof sr->distinct_experts);
            ds_trace_step_fill(tt, sr); // NULL (not traced): the phase times stay 0
            for (int j = 0; j < res->drafted; j++) {
                struct ds_rec_draft *d = &r->drows[nd++];
                *d = res->drafts[j];
                d->step = step_id;
                d->request = l->id;
                d->batch_size = (uint16_t)n;
                const bool q_ok = d->q_draft > 0.0f && isfinite(d->q_draft);
                r->st->nonfinite_q += !res->nonfinite && !q_ok;
            }
            r->st->steps++;
            // The steps of the acceptance length, as the summary counts them: a step that drafted
            // nothing or whose verify logits were not finite verified no draft.
            r->st->drafted_steps += res->drafted > 0 && !res->nonfinite;
            r->st->accepted += (uint64_t)res->accepted;
        }
        if (ended) continue;
        if (res->nonfinite && (s = finish(r, slot, DS_REC_STOP_ERROR))) return s;
        // At the limit now: ended here (its row after this step's rows), its slot refilled
        // before the next step.
        if (!res->nonfinite && at_limit(r, l) &&
            (s = finish(r, slot, DS_REC_STOP_CONTEXT_LIMIT)))
            return s;
    }
    r->defer_requests = false;
    if ((s = ds_recorder_append_steps(r->rec, r->srows, ns)) ||
        (s = ds_recorder_append_drafts(r->rec, r->drows, nd)) ||
        (s = ds_recorder_append_requests(r->rec, r->qrows, r->n_qrows)))
        return s;
    progress(r, 0);
    return maybe_flush(r, 0);
}

static enum ds_status replay_batch(struct replay *r) {
    enum ds_status s;
    plan_batch(r, r->B);
    for (size_t i = 0; i < r->w->n; i++)
        if (!r->run[i]) r->st->resumed++, r->done_total++;
    for (;;) {
        int admitted;
        if ((s = admit(r, &admitted))) return s;
        int live = 0;
        for (uint32_t slot = 0; slot < r->B; slot++)
            live += r->live[slot].used;
        if (live == 0) {
            if (!any_waiting(r)) break;
            if (admitted == 0 && next_admissible(r) < 0) // nothing can start: should not happen
                return ds_error_set(DS_ERR_ARG, "replay: requests wait on turns that never ran");
            continue;
        }
        if ((s = step(r))) return s;
        if (ds_recorder_stop_requested()) return DS_ERR_INTERRUPTED;
    }
    progress(r, 1);
    return maybe_flush(r, 1);
}

enum ds_status ds_replay_run(ds_spec_t *spec, ds_harmony_t *h, const ds_tokenizer_t *tok,
                             const ds_dataset_t *ds, struct ds_replay_work *w,
                             const struct ds_replay_config *cfg, ds_recorder_t *rec,
                             const struct ds_resume_info *resume, struct ds_replay_stats *st) {
    memset(st, 0, sizeof *st);
    if (!spec || !h || !ds || !w || !cfg || !rec || cfg->max_new_tokens < 1)
        return ds_error_set(DS_ERR_ARG, "replay: missing argument");
    struct replay r = {.sp = spec,
                       .h = h,
                       .tok = tok,
                       .ds = ds,
                       .w = w,
                       .cfg = cfg,
                       .rec = rec,
                       .resume = resume,
                       .st = st,
                       .S = ds_spec_max_slots(spec),
                       .P = ds_spec_max_pos(spec),
                       .max_new = cfg->max_new_tokens,
                       .step_id = resume ? resume->next_step : 0,
                       .next_request = resume ? resume->next_request : 0,
                       .t_flush = now_s()};
    for (size_t b = 0; b < cfg->n_batch_sizes; b++)
        if (cfg->batch_sizes[b] < 1 || cfg->batch_sizes[b] > (uint32_t)r.S)
            return ds_error_set(DS_ERR_RANGE, "replay: batch size %u outside the plan's 1..%d",
                                cfg->batch_sizes[b], r.S);
    const size_t S = (size_t)r.S, n = w->n;
    enum ds_status s = DS_OK;
    r.live = calloc(S, sizeof *r.live);
    r.state = calloc(n + 1, 1);
    r.run = calloc(n + 1, 1);
    r.record = calloc(n + 1, 1);
    r.reply = calloc(n + 1, sizeof *r.reply);
    r.msgs = calloc(w->max_messages + 1, sizeof *r.msgs);
    r.seqp = calloc(S, sizeof *r.seqp);
    r.newp = calloc(S, sizeof *r.newp);
    r.slot_of = calloc(S, sizeof *r.slot_of);
    r.prompts = calloc(S, sizeof *r.prompts);
    r.lens = calloc(S, sizeof *r.lens);
    r.res = calloc(S, sizeof *r.res);
    r.srows = calloc(S, sizeof *r.srows);
    r.drows = calloc(S * DS_SPEC_MAX_K, sizeof *r.drows);
    r.qrows = calloc(S, sizeof *r.qrows);
    bool ok = r.live && r.state && r.run && r.record && r.reply && r.msgs && r.seqp && r.newp &&
              r.slot_of && r.prompts && r.lens && r.res && r.srows && r.drows && r.qrows;
    for (size_t i = 0; ok && i < S; i++) {
        r.live[i].gen = malloc((size_t)cfg->max_new_tokens * sizeof(int32_t));
        r.live[i].fin = malloc((size_t)cfg->max_new_tokens * sizeof(int32_t));
        ok = r.live[i].gen && r.live[i].fin;
    }
    if (!ok) s = ds_error_set(DS_ERR_NOMEM, "replay: out of memory");
    if (s == DS_OK) s = index_done(&r);
    size_t total = 0;
    for (size_t b = 0; b < cfg->n_batch_sizes; b++)
        total += n;
    if (cfg->progress) cfg->progress->total = total;
    for (size_t b = 0; s == DS_OK && b < cfg->n_batch_sizes; b++) {
        r.B = cfg->batch_sizes[b];
        s = replay_batch(&r);
    }
    if (cfg->progress) ds_progress_finish(cfg->progress);
    st->next_step = r.step_id;
    for (size_t i = 0; r.live && i < S; i++) {
        free(r.live[i].gen);
        free(r.live[i].fin);
    }
    for (size_t i = 0; r.reply && i < n; i++)
        ds_byte_vec_free(&r.reply[i]);
    free(r.live);
    free(r.state);
    free(r.run);
    free(r.record);
    free(r.reply);
    free(r.msgs);
    free(r.seqp);
    free(r.newp);
    free(r.slot_of);
    free(r.prompts);
    free(r.lens);
    free(r.res);
    free(r.srows);
    free(r.qrows);
    free(r.drows);
    free(r.done_keys);
    return s;
}
