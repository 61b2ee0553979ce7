/* migrate.c — a running training job moved to another layout at a step boundary (trainer.h,
 * shard_trainer_migrate): stop-and-copy over the communicator, no files; or live (the last section:
 * shard_trainer_migrate_begin, shard_migration_advance, shard_migration_finish), the same plan sent in
 * pieces while training goes on, each step's gradients replayed on the copy.
 *
 *   1. the new trainer is built on the new mesh (its own model, strategy and optimizer state; its
 *      weights not drawn and its memory not touched, as every value is about to be written);
 *   2. every piece of state the run keeps across steps moves to it: each parameter's values and each of
 *      the optimizer's state arrays (AdamW's two moments, SGD's momentum buffer).  The rest of what a
 *      step depends on is not state: the step count and the learning rate's place in its schedule are
 *      the step number the caller passes, and the rows and dropout masks are drawn from (seed, step,
 *      row), which the new trainer has from its config;
 *   3. every rank agrees that it all went well; only then is the old trainer destroyed.  A failure on
 *      any rank (an allocation refused, a deadline, a model that does not match) leaves every rank with
 *      the old trainer as it was — the copy only reads it — and the same one line saying why.
 *
 * How the bytes move: the least traffic, planned in memory as a checkpoint load plans its reads
 * (src/ckpt/checkpoint_load.c).  Every rank describes, for each parameter and each state array, what it
 * holds under both layouts as runs of the whole tensor's elements: its piece's map (pipeline stage,
 * expert rows, tensor block: found by taking the piece of a tensor of element indices, so it is the
 * trainer's own map whatever the model) cut to the ranges it holds (ZeRO's flat shards: each unit
 * cut evenly over the data ranks; all of it where the array is whole).  One all_gather gives every
 * rank every description; each then plans the same moves: rank q receives what it holds in the new
 * layout and did not hold in the old, each range from the lowest rank that held it (one sender per
 * range), and copies what it held in both itself.  The parameters go in batches of consecutive ones
 * (about an eighth of the elements each for stop-and-copy): one all_to_allv per batch over the world
 * communicator carries all their arrays, each peer's part parameter after parameter (none when
 * nothing moves); the values are copied, never summed, so they arrive bit for bit.  The bytes (the communicator's count over those calls, in the stats)
 * are what each new holder lacked, once: at most the state once per copy the new layout keeps of it
 * (its data-axis replicas); none from data=4 at ZeRO-0 to data=2,pipe=2, where every rank already
 * held its new stage whole; from ZeRO-3 on data=4 to ZeRO-1 on data=2,pipe=2 about 2.5 x the
 * parameters' bytes, below the state once (3 x).  The descriptions and agreements (a few words per
 * run) are not in that count.
 *
 * The whole-tensor way is kept for a parameter whose layout runs cannot express — a model whose piece
 * is not a copy of distinct elements of the whole tensor — or whose new owners need an element no
 * rank held: that parameter's arrays are made whole on every rank (a gather over the data axis for
 * ZeRO's shards, over the tensor and expert axes for their blocks, a sum over the pipe axis from the
 * stage that holds it — as a checkpoint is saved) and each rank keeps its new piece (as a checkpoint
 * is resumed): about world x its bytes. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "shard/dtype.h"
#include "shard/memory.h"
#include "shard/optim.h"
#include "shard/trainer.h"
#include "train/trainer_impl.h"

/* Collective over world: SHARD_OK when s is on every rank; else the first failing rank's status and
 * text on every rank (broadcast from it), so all stop together and say the same.  agree_and also gives
 * every rank the least of each rank's *flag (1 on every rank: all said yes). */
static shard_status agree_and(shard_comm *world, shard_status s, int32_t *flag) {
    int rank = shard_comm_rank(world);
    int32_t mine[2] = {s < 0 ? rank : INT32_MAX, flag ? *flag : 0}, got[2] = {INT32_MAX, 0}, first, code = s;
    char why[1024] = "";
    shard_status c = shard_comm_all_reduce(world, mine, got, flag ? 2 : 1, SHARD_I32, SHARD_OP_MIN);
    if (c < 0) return s < 0 ? s : c;
    if (flag) *flag = got[1];
    first = got[0];
    if (first == INT32_MAX) return SHARD_OK;
    if (rank == first) snprintf(why, sizeof why, "%s", shard_last_error());
    c = shard_comm_broadcast(world, why, sizeof why, SHARD_U8, first);
    if (c == SHARD_OK) c = shard_comm_broadcast(world, &code, 1, SHARD_I32, first);
    if (c < 0) return s < 0 ? s : c;
    why[sizeof why - 1] = '\0';
    if (shard_comm_size(world) == 1 || rank == first) return shard_error(code, "%s", why);
    return shard_error(code, "rank %d: %s", (int)first, why);
}

static shard_status agree(shard_comm *world, shard_status s) { return agree_and(world, s, NULL); }

/* Collective over world: whether every rank got this far: s where it did not, else SHARD_OK, or an
 * error naming none (agree, after the copy, gives every rank the failing rank's own text). */
static shard_status agree_all(shard_comm *world, shard_status s) {
    int32_t bad = s < 0, any = 0;
    shard_status c = shard_comm_all_reduce(world, &bad, &any, 1, SHARD_I32, SHARD_OP_MAX);
    if (s < 0) return s;
    if (c < 0) return c;
    return any ? shard_error(SHARD_ERR_ABORTED, "migrate: another rank could not take part (it says why)") : SHARD_OK;
}

/* ---------------------------------------------------------------- what each rank holds */

/* Elements [g, g + n) of a parameter's whole tensor (row-major), held at [p, p + n) of a rank's piece. */
typedef struct run {
    size_t g, p, n;
} run;

typedef struct runs {
    run *v;
    size_t n, cap;
} runs;

static int runs_push(runs *r, size_t g, size_t p, size_t n) {
    if (n == 0) return 1;
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        run *v = realloc(r->v, cap * sizeof *v);
        if (!v) return 0;
        r->v = v, r->cap = cap;
    }
    r->v[r->n++] = (run){g, p, n};
    return 1;
}

static int by_global(const void *a, const void *b) {
    size_t x = ((const run *)a)->g, y = ((const run *)b)->g;
    return (x > y) - (x < y);
}

/* out = the elements of a that b holds too (common 1), or that b lacks (common 0): both sorted by
 * global index and disjoint, and so is out (its piece places are a's). */
static int runs_cut(const runs *a, const runs *b, int common, runs *out) {
    out->n = 0;
    for (size_t i = 0, first = 0; i < a->n; i++) {
        size_t x = a->v[i].g, y = x + a->v[i].n, at = x;
        while (first < b->n && b->v[first].g + b->v[first].n <= x) first++;
        for (size_t k = first; k < b->n && b->v[k].g < y; k++) {
            size_t lo = b->v[k].g > x ? b->v[k].g : x, hi = b->v[k].g + b->v[k].n < y ? b->v[k].g + b->v[k].n : y;
            if (!runs_push(out, common ? lo : at, a->v[i].p + ((common ? lo : at) - x), common ? hi - lo : lo - at))
                return 0;
            at = hi;
        }
        if (!common && !runs_push(out, at, a->v[i].p + (at - x), y - at)) return 0;
    }
    return 1;
}

static size_t runs_elems(const runs *r) {
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++) n += r->v[i].n;
    return n;
}

/* The run of r (sorted by global index) that holds element g. */
static const run *run_of(const runs *r, size_t g) {
    size_t lo = 0, hi = r->n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->v[mid].g <= g)
            lo = mid;
        else
            hi = mid;
    }
    return &r->v[lo];
}

/* Elements [g, g + n) from `src` to `dst`: each a piece laid out by its runs, or, with runs NULL, a
 * packed buffer whose place *at moves on. */
static void copy_elems(const runs *sr, const float *src, size_t *src_at, const runs *dr, float *dst, size_t *dst_at,
                       size_t g, size_t n) {
    while (n > 0) {
        size_t len = n, from = src_at ? *src_at : 0, to = dst_at ? *dst_at : 0;
        if (sr) {
            const run *r = run_of(sr, g);
            from = r->p + (g - r->g), len = r->g + r->n - g < len ? r->g + r->n - g : len;
        }
        if (dr) {
            const run *r = run_of(dr, g);
            to = r->p + (g - r->g), len = r->g + r->n - g < len ? r->g + r->n - g : len;
        }
        if (len) memcpy(dst + to, src + from, len * sizeof *dst);
        if (src_at) *src_at += len;
        if (dst_at) *dst_at += len;
        g += len, n -= len;
    }
}

/* ---------------------------------------------------------------- the layouts described */

/* A growing list of int64: a rank's description of both layouts, as it travels. */
typedef struct words {
    int64_t *v;
    size_t n, cap;
} words;

static int words_push(words *w, int64_t x) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        int64_t *v = realloc(w->v, cap * sizeof *v);
        if (!v) return 0;
        w->v = v, w->cap = cap;
    }
    w->v[w->n++] = x;
    return 1;
}

/* Element indices below 2^24 are exact in a float. */
#define LOW_INDEX ((size_t)1 << 24)

static void fill_low_index(float *whole, size_t n) {
    for (size_t e = 0; e < n; e++) whole[e] = (float)(e & 0xFFFFFFu);
}

/* How many leading elements of a and b are the same bits (blocks compared whole, then one by one). */
static size_t same_prefix(const float *a, const float *b, size_t n) {
    enum { BLOCK = 64 };
    size_t k = 0;
    while (k + BLOCK <= n && memcmp(a + k, b + k, BLOCK * sizeof *a) == 0) k += BLOCK;
    while (k < n && memcmp(a + k, b + k, sizeof *a) == 0) k++;
    return k;
}

/* The runs of parameter i's piece in trainer t (in piece order): the piece taken from a whole tensor
 * whose every element holds its own index, 24 bits at a time (a float holds those exactly), so the
 * map is the one the trainer's own resume applies, whatever the model's tensor blocks and the expert
 * rows.  `whole` holds the low 24 bits of each index on entry and on return (filled once for every
 * parameter); a tensor of more than 2^24 elements takes its piece a second time for the high bits.
 * 0 when the piece is not a copy of distinct elements of the whole tensor: that parameter then moves
 * the whole-tensor way. */
static int piece_runs(const shard_trainer *t, size_t i, size_t whole_n, float *whole, float *lo, float *hi, runs *out) {
    size_t n = shard__trainer_piece_numel(t, i);
    shard__trainer_take_piece(t, i, whole, lo);
    if (whole_n > LOW_INDEX) {
        for (size_t e = 0; e < whole_n; e++) whole[e] = (float)(e >> 24);
        shard__trainer_take_piece(t, i, whole, hi);
        fill_low_index(whole, whole_n);
    } else if (n)
        memset(hi, 0, n * sizeof *hi);
    out->n = 0;
    for (size_t p = 0; p < n;) {
        if (!(lo[p] >= 0 && lo[p] < 16777216.0f && hi[p] >= 0 && hi[p] < 16777216.0f) ||
            lo[p] != (float)(size_t)lo[p] || hi[p] != (float)(size_t)hi[p])
            return 0;
        size_t g = (size_t)hi[p] << 24 | (size_t)lo[p], p0 = p;
        if (g >= whole_n) return 0;
        /* the run goes on while each element holds the next index (a run stops where the low bits wrap) */
        size_t end = n - p < whole_n - g ? n : p + (whole_n - g);
        if (whole_n <= LOW_INDEX) /* whole[e] is e itself: the run is the prefix where the two agree */
            p += 1 + same_prefix(lo + p + 1, whole + g + 1, end - p - 1);
        else {
            float hi_bits = hi[p];
            for (float next = lo[p] + 1.0f; ++p < end && lo[p] == next && hi[p] == hi_bits && next < 16777216.0f;)
                next += 1.0f;
        }
        run *last = out->n ? &out->v[out->n - 1] : NULL;
        if (last && last->g + last->n == g && last->p + last->n == p0)
            last->n += p - p0; /* across a wrap of the low bits */
        else if (!runs_push(out, g, p0, p - p0))
            return -1;
    }
    runs sorted = {.v = malloc((out->n + 1) * sizeof *sorted.v), .n = out->n};
    if (!sorted.v) return -1;
    if (out->n) memcpy(sorted.v, out->v, out->n * sizeof *sorted.v);
    qsort(sorted.v, sorted.n, sizeof *sorted.v, by_global);
    int distinct = 1;
    for (size_t k = 1; k < sorted.n; k++) distinct &= sorted.v[k - 1].g + sorted.v[k - 1].n <= sorted.v[k].g;
    free(sorted.v);
    return distinct;
}

/* One trainer's layout of moved parameter k as this rank holds it, appended to w: a flag (0: not
 * expressible by runs), the piece's runs (g, p, n), then for each state array the piece's ranges this
 * rank holds (ZeRO's shards; all of it otherwise): [ok, R, R x (g, p, n), arrays x (H, H x (lo, hi))]. */
static shard_status describe(const shard_trainer *t, size_t i, size_t whole_n, int arrays, float *scratch[3], runs *pr,
                             words *w) {
    int ok = 1;
    pr->n = 0;
    if (i != SIZE_MAX) ok = piece_runs(t, i, whole_n, scratch[0], scratch[1], scratch[2], pr);
    if (ok < 0) return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    int fine = words_push(w, ok) && words_push(w, ok ? (int64_t)pr->n : 0);
    for (size_t r = 0; fine && ok && r < pr->n; r++)
        fine = words_push(w, (int64_t)pr->v[r].g) && words_push(w, (int64_t)pr->v[r].p) &&
            words_push(w, (int64_t)pr->v[r].n);
    for (int j = 0; fine && j < arrays; j++) {
        size_t count = 0, *lo = NULL, *hi = NULL;
        if (ok && i != SIZE_MAX) {
            SHARD_CHECK(shard__trainer_held(t, i, j, NULL, NULL, 0, &count));
            lo = malloc((count + 1) * sizeof *lo), hi = malloc((count + 1) * sizeof *hi);
            shard_status s = lo && hi ? shard__trainer_held(t, i, j, lo, hi, count, &count)
                                      : shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
            if (s < 0) {
                free(lo), free(hi);
                return s;
            }
        }
        fine = words_push(w, (int64_t)count);
        for (size_t h = 0; fine && h < count; h++)
            fine = words_push(w, (int64_t)lo[h]) && words_push(w, (int64_t)hi[h]);
        free(lo), free(hi);
    }
    return fine ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
}

/* Array j of a description (describe's words at d) as runs sorted by global index: the piece's runs cut
 * to the ranges held.  0: not expressible. */
static int held_runs(const int64_t *d, int j, runs *out) {
    out->n = 0;
    if (!d[0]) return 0;
    size_t R = (size_t)d[1];
    const int64_t *pr = d + 2, *h = pr + 3 * R;
    for (int k = 0; k < j; k++) h += 1 + 2 * h[0];
    size_t H = (size_t)h[0];
    for (size_t r = 0, k = 0; r < R; r++) { /* both in piece order */
        size_t g = (size_t)pr[3 * r], p = (size_t)pr[3 * r + 1], n = (size_t)pr[3 * r + 2];
        while (k < H && (size_t)h[2 + 2 * k] <= p) k++;
        for (size_t m = k; m < H && (size_t)h[1 + 2 * m] < p + n; m++) {
            size_t lo = (size_t)h[1 + 2 * m] > p ? (size_t)h[1 + 2 * m] : p;
            size_t hi = (size_t)h[2 + 2 * m] < p + n ? (size_t)h[2 + 2 * m] : p + n;
            if (!runs_push(out, g + (lo - p), lo, hi - lo)) return -1;
        }
    }
    if (out->n) qsort(out->v, out->n, sizeof *out->v, by_global); /* none: no array to sort */
    return 1;
}

/* A description's length in words. */
static size_t described_words(const int64_t *d, int arrays) {
    const int64_t *h = d + 2 + 3 * d[1];
    for (int j = 0; j < arrays; j++) h += 1 + 2 * h[0];
    return (size_t)(h - d);
}

/* ---------------------------------------------------------------- the plan */

/* Elements [g, g + n) of state array j sent to (or received from) rank `peer`. */
typedef struct move {
    size_t g, n;
    int peer, j;
} move;

/* How one parameter moves: the whole-tensor way, or by its all_to_allv (elements per rank each way;
 * total: every rank's, so 0 on every rank when nothing moves) and the local copy. */
typedef struct tensor_plan {
    int whole_way;
    size_t total, *send, *recv;
    size_t delta_total, *delta_send, *delta_recv; /* the same for a live migration's gradient array */
    move *sends, *recvs;                          /* this rank's: each peer's moves in (array, global index) order */
    size_t n_sends, n_recvs;
} tensor_plan;

static int moves_push(move **v, size_t *n, size_t *cap, const runs *part, int peer, int j) {
    for (size_t r = 0; r < part->n; r++) {
        if (*n == *cap) {
            size_t grown = *cap ? 2 * *cap : 16;
            move *m = realloc(*v, grown * sizeof *m);
            if (!m) return 0;
            *v = m, *cap = grown;
        }
        (*v)[(*n)++] = (move){part->v[r].g, part->v[r].n, peer, j};
    }
    return 1;
}

/* Scratch lists for the planning of one parameter: old[r * arrays + j] and new[r * arrays + j]. */
typedef struct planning {
    int world, me, arrays, delta_j;
    runs *old, *new_, lack, part, rest;
} planning;

/* Parameter k's plan from every rank's descriptions (desc[(r * 2 + L) * n + k]; L 0 old, 1 new): for
 * each rank q and array j, what q holds in the new layout but not in the old, taken from the lowest
 * rank that holds it in the old; the whole-tensor way if some rank's layout is not expressible by runs
 * or no rank holds an element a new owner needs.  The same on every rank. */
static shard_status plan_tensor(planning *pl, const int64_t *const *desc, size_t n, size_t k, tensor_plan *tp) {
    int W = pl->world, A = pl->arrays;
    size_t sends_cap = 0, recvs_cap = 0;
    for (int r = 0; r < W; r++)
        for (int L = 0; L < 2; L++)
            if (!desc[((size_t)r * 2 + (size_t)L) * n + k][0]) tp->whole_way = 1;
    if (tp->whole_way) return SHARD_OK;
    for (int r = 0; r < W; r++)
        for (int j = 0; j < A; j++) {
            size_t at = (size_t)r * (size_t)A + (size_t)j;
            if (held_runs(desc[((size_t)r * 2) * n + k], j, &pl->old[at]) < 0 ||
                held_runs(desc[((size_t)r * 2 + 1) * n + k], j, &pl->new_[at]) < 0)
                return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
        }
    for (int q = 0; q < W; q++)
        for (int j = 0; j < A; j++) {
            size_t qj = (size_t)q * (size_t)A + (size_t)j;
            if (!runs_cut(&pl->new_[qj], &pl->old[qj], 0, &pl->lack))
                return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
            for (int from = 0; from < W && pl->lack.n; from++) {
                const runs *held = &pl->old[(size_t)from * (size_t)A + (size_t)j];
                if (from == q) continue;
                if (!runs_cut(&pl->lack, held, 1, &pl->part))
                    return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
                if (!pl->part.n) continue;
                size_t elems = runs_elems(&pl->part);
                int delta = j == pl->delta_j; /* counted apart: it moves at each step, not with the snapshot */
                *(delta ? &tp->delta_total : &tp->total) += elems;
                if ((from == pl->me && !moves_push(&tp->sends, &tp->n_sends, &sends_cap, &pl->part, q, j)) ||
                    (q == pl->me && !moves_push(&tp->recvs, &tp->n_recvs, &recvs_cap, &pl->part, from, j)) ||
                    !runs_cut(&pl->lack, held, 0, &pl->rest))
                    return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
                if (from == pl->me) (delta ? tp->delta_send : tp->send)[q] += elems;
                if (q == pl->me) (delta ? tp->delta_recv : tp->recv)[from] += elems;
                runs swap = pl->lack;
                pl->lack = pl->rest, pl->rest = swap;
            }
            if (pl->lack.n) tp->whole_way = 1; /* no rank holds what q needs: the whole way shows it */
        }
    return SHARD_OK;
}

/* ---------------------------------------------------------------- the copy */

/* What the copy keeps from planning to the end. */
typedef struct copy {
    shard_trainer *from, *to;
    shard__moved_param *list;
    size_t n;
    int world, me, arrays, delta_j; /* delta_j: a live migration's gradient array (the last), else -1 */
    int delta_bf16;                 /* this advance's gradients are bf16 exactly on every rank: sent as bf16 */
    words mine;                     /* this rank's descriptions: old layout's n, then the new one's */
    int64_t *all;                   /* every rank's, in rank order */
    const int64_t **desc;           /* [(r * 2 + L) * n + k] */
    tensor_plan *plans;
    /* the parameters in batches, each moved by one all_to_allv (or the whole-tensor way, one a batch):
     * batch b is [batch_at[b], batch_at[b + 1]); the same on every rank */
    size_t *batch_at, batches, batches_wanted; /* wanted: about how many (each about 1/wanted of the elements) */
    float *old_piece, *new_piece, *send, *recv, *whole; /* whole: the whole-tensor way's scratch */
    runs held_old, held_new, both;
} copy;

static void copy_free(copy *c) {
    for (size_t k = 0; c->plans && k < c->n; k++) {
        free(c->plans[k].send), free(c->plans[k].recv), free(c->plans[k].sends), free(c->plans[k].recvs);
        free(c->plans[k].delta_send), free(c->plans[k].delta_recv);
    }
    free(c->plans), free(c->desc), free(c->all), free(c->mine.v), free(c->list), free(c->batch_at);
    free(c->held_old.v), free(c->held_new.v), free(c->both.v);
    shard_free(c->old_piece), shard_free(c->new_piece), shard_free(c->send), shard_free(c->recv), shard_free(c->whole);
}

static size_t larger(size_t a, size_t b) { return a > b ? a : b; }

/* Every moved parameter described by this rank in both layouts (c->mine). */
static shard_status describe_all(copy *c) {
    size_t most_whole = 1, most_piece = 1;
    for (size_t k = 0; k < c->n; k++) {
        most_whole = larger(most_whole, c->list[k].whole_n);
        if (c->list[k].from != SIZE_MAX)
            most_piece = larger(most_piece, shard__trainer_piece_numel(c->from, c->list[k].from));
        if (c->list[k].to != SIZE_MAX)
            most_piece = larger(most_piece, shard__trainer_piece_numel(c->to, c->list[k].to));
    }
    float *scratch[3] = {shard_alloc(most_whole * sizeof(float), SHARD_MEM_OTHER),
                         shard_alloc(most_piece * sizeof(float), SHARD_MEM_OTHER),
                         shard_alloc(most_piece * sizeof(float), SHARD_MEM_OTHER)};
    runs pr = {0};
    shard_status s =
        scratch[0] && scratch[1] && scratch[2] ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    if (s == SHARD_OK) fill_low_index(scratch[0], most_whole);
    for (int L = 0; L < 2; L++)
        for (size_t k = 0; s == SHARD_OK && k < c->n; k++)
            s = describe(L ? c->to : c->from, L ? c->list[k].to : c->list[k].from, c->list[k].whole_n, c->arrays,
                         scratch, &pr, &c->mine);
    for (int b = 0; b < 3; b++) shard_free(scratch[b]);
    free(pr.v);
    return s;
}

/* Collective over world: every rank's descriptions to every rank (c->all, indexed by c->desc). */
static shard_status share(copy *c, shard_comm *world) {
    size_t W = (size_t)c->world, total = 0;
    int64_t mine = (int64_t)c->mine.n, *sizes = calloc(W, sizeof *sizes);
    size_t *counts = calloc(W, sizeof *counts), *displs = calloc(W, sizeof *displs);
    c->desc = calloc(W * 2 * c->n + 1, sizeof *c->desc);
    shard_status s =
        sizes && counts && displs && c->desc ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    if (s == SHARD_OK) s = shard_comm_all_gather(world, &mine, sizes, 1, SHARD_I64);
    for (size_t r = 0; s == SHARD_OK && r < W; r++) counts[r] = (size_t)sizes[r], displs[r] = total, total += counts[r];
    if (s == SHARD_OK && !(c->all = malloc((total + 1) * sizeof *c->all)))
        s = shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    if (s == SHARD_OK) s = shard_comm_all_gatherv(world, c->mine.v, c->mine.n, c->all, counts, displs, SHARD_I64);
    for (size_t r = 0; s == SHARD_OK && r < W; r++) {
        const int64_t *d = c->all + displs[r];
        for (size_t L = 0; L < 2; L++)
            for (size_t k = 0; k < c->n; k++) {
                c->desc[(r * 2 + L) * c->n + k] = d;
                d += described_words(d, c->arrays);
            }
    }
    free(sizes), free(counts), free(displs);
    return s;
}

/* The elements this rank sends and receives for the parameters [lo, hi) by their plans, the full
 * arrays' moves (delta 0) or the gradient's. */
static void batch_counts(const copy *c, size_t lo, size_t hi, int delta, size_t *sent, size_t *got) {
    *sent = *got = 0;
    for (size_t k = lo; k < hi; k++)
        for (size_t r = 0; r < (size_t)c->world; r++) {
            *sent += delta ? c->plans[k].delta_send[r] : c->plans[k].send[r];
            *got += delta ? c->plans[k].delta_recv[r] : c->plans[k].recv[r];
        }
}

/* The batches (c->batch_at): consecutive parameters moved by plan, up to 1/c->batches_wanted of the
 * elements (or the largest parameter) each, so that a copy takes a few collectives rather than one per parameter; a
 * parameter moved the whole-tensor way is a batch of its own.  *most_send, *most_recv: the most one
 * batch sends and receives on this rank, the buffers' sizes. */
static shard_status make_batches(copy *c, size_t *most_send, size_t *most_recv) {
    size_t all = 0, largest = 0;
    for (size_t k = 0; k < c->n; k++) all += c->list[k].whole_n, largest = larger(largest, c->list[k].whole_n);
    size_t budget = larger(largest, all / c->batches_wanted);
    if (!(c->batch_at = calloc(c->n + 2, sizeof *c->batch_at)))
        return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    c->batches = 0;
    for (size_t k = 0; k < c->n;) {
        size_t lo = k, elems = c->list[k].whole_n;
        k++;
        if (!c->plans[lo].whole_way)
            while (k < c->n && !c->plans[k].whole_way && elems + c->list[k].whole_n <= budget)
                elems += c->list[k++].whole_n;
        c->batch_at[c->batches++] = lo;
        if (c->plans[lo].whole_way) continue;
        for (int delta = 0; delta < 2; delta++) {
            size_t sent, got;
            batch_counts(c, lo, k, delta, &sent, &got);
            *most_send = larger(*most_send, sent), *most_recv = larger(*most_recv, got);
        }
    }
    c->batch_at[c->batches] = c->n;
    return SHARD_OK;
}

/* Every parameter's plan, and the buffers the copy needs: all allocated before any element moves. */
static shard_status plan_all(copy *c) {
    size_t W = (size_t)c->world, A = (size_t)c->arrays, most_send = 1, most_recv = 1, most_old = 1, most_new = 1,
           most_whole = 0;
    planning pl = {.world = c->world, .me = c->me, .arrays = c->arrays, .delta_j = c->delta_j};
    pl.old = calloc(W * A, sizeof *pl.old), pl.new_ = calloc(W * A, sizeof *pl.new_);
    c->plans = calloc(c->n + 1, sizeof *c->plans);
    shard_status s =
        pl.old && pl.new_ && c->plans ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    for (size_t k = 0; s == SHARD_OK && k < c->n; k++) {
        tensor_plan *tp = &c->plans[k];
        tp->send = calloc(W, sizeof *tp->send), tp->recv = calloc(W, sizeof *tp->recv);
        tp->delta_send = calloc(W, sizeof *tp->delta_send), tp->delta_recv = calloc(W, sizeof *tp->delta_recv);
        s = tp->send && tp->recv && tp->delta_send && tp->delta_recv
            ? plan_tensor(&pl, c->desc, c->n, k, tp)
            : shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
        if (c->list[k].from != SIZE_MAX)
            most_old = larger(most_old, shard__trainer_piece_numel(c->from, c->list[k].from));
        if (c->list[k].to != SIZE_MAX) most_new = larger(most_new, shard__trainer_piece_numel(c->to, c->list[k].to));
        if (tp->whole_way) most_whole = larger(most_whole, c->list[k].whole_n);
    }
    for (size_t r = 0; pl.old && r < W * A; r++) free(pl.old[r].v);
    for (size_t r = 0; pl.new_ && r < W * A; r++) free(pl.new_[r].v);
    free(pl.old), free(pl.new_), free(pl.lack.v), free(pl.part.v), free(pl.rest.v);
    if (s == SHARD_OK) s = make_batches(c, &most_send, &most_recv);
    if (s < 0) return s;
    c->old_piece = shard_alloc(most_old * sizeof(float), SHARD_MEM_OTHER);
    c->new_piece = shard_alloc(most_new * sizeof(float), SHARD_MEM_OTHER);
    c->send = shard_alloc(most_send * sizeof(float), SHARD_MEM_COMM);
    c->recv = shard_alloc(most_recv * sizeof(float), SHARD_MEM_COMM);
    if (most_whole) c->whole = shard_alloc(most_whole * sizeof(float), SHARD_MEM_OTHER);
    if (!c->old_piece || !c->new_piece || !c->send || !c->recv || (most_whole && !c->whole))
        return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    return SHARD_OK;
}

/* The arrays a move carries: a live migration's gradient array (delta), or the others. */
static void arrays_moved(const copy *c, int delta, int *lo, int *hi) {
    *lo = delta ? c->delta_j : 0;
    *hi = delta ? c->delta_j + 1 : c->delta_j < 0 ? c->arrays : c->delta_j;
}

/* Parameter k the whole-tensor way: each array made whole on every rank over the old mesh (as a save
 * does) and this rank's piece kept (as a resume does). */
static shard_status move_whole(copy *c, size_t k, int delta) {
    const shard__moved_param *mp = &c->list[k];
    shard_status s = SHARD_OK;
    int j_lo, j_hi;
    arrays_moved(c, delta, &j_lo, &j_hi);
    for (int j = j_lo; s == SHARD_OK && j < j_hi; j++) {
        s = shard__trainer_param_whole(c->from, mp->from, j, mp->whole_n, c->old_piece, c->whole);
        if (s < 0 || mp->to == SIZE_MAX) continue; /* another stage's in the new layout */
        shard__trainer_take_piece(c->to, mp->to, c->whole, c->new_piece);
        s = shard__trainer_set_piece(c->to, mp->to, j, c->new_piece);
    }
    return s;
}

/* Array j of parameter k as this rank held it in the old layout: the values in c->old_piece, where
 * they lie in c->held_old. */
static shard_status read_old(copy *c, size_t k, int j) {
    c->held_old.n = 0;
    if (c->list[k].from == SIZE_MAX) return SHARD_OK;
    if (held_runs(c->desc[((size_t)c->me * 2) * c->n + k], j, &c->held_old) < 0)
        return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    return shard__trainer_get_held(c->from, c->list[k].from, j, c->old_piece);
}

/* n floats made n bf16 values in the same buffer, in place: element e's 2 bytes land before its 4
 * are read, going up (byte copies: the buffer is read and written as both types). */
static void narrow_to_bf16(float *x, size_t n) {
    unsigned char *bytes = (unsigned char *)x;
    for (size_t e = 0; e < n; e++) {
        float v;
        memcpy(&v, bytes + 4 * e, sizeof v);
        uint16_t h = shard_bf16_from_f32(v);
        memcpy(bytes + 2 * e, &h, sizeof h);
    }
}

/* The reverse: n bf16 values at the start of x widened to n floats, going down. */
static void widen_from_bf16(float *x, size_t n) {
    unsigned char *bytes = (unsigned char *)x;
    for (size_t e = n; e-- > 0;) {
        uint16_t h;
        memcpy(&h, bytes + 2 * e, sizeof h);
        float v = shard_f32_from_bf16(h);
        memcpy(bytes + 4 * e, &v, sizeof v);
    }
}

/* Parameter k's moves of this rank packed into c->send, each peer's after what at[peer] says. */
static shard_status pack_sends(copy *c, size_t k, int delta, size_t *at) {
    const tensor_plan *tp = &c->plans[k];
    int j_lo, j_hi;
    arrays_moved(c, delta, &j_lo, &j_hi);
    shard_status s = SHARD_OK;
    for (int j = j_lo; s == SHARD_OK && tp->n_sends && j < j_hi; j++) {
        s = read_old(c, k, j);
        for (size_t m = 0; s == SHARD_OK && m < tp->n_sends; m++)
            if (tp->sends[m].j == j)
                copy_elems(&c->held_old, c->old_piece, NULL, NULL, c->send, &at[tp->sends[m].peer], tp->sends[m].g,
                           tp->sends[m].n);
    }
    return s;
}

/* Each array of parameter k's new piece on this rank from what it held and what it received (in
 * c->recv, each peer's after what at[peer] says). */
static shard_status unpack_recvs(copy *c, size_t k, int delta, size_t *at) {
    const tensor_plan *tp = &c->plans[k];
    const shard__moved_param *mp = &c->list[k];
    int j_lo, j_hi;
    arrays_moved(c, delta, &j_lo, &j_hi);
    shard_status s = SHARD_OK;
    for (int j = j_lo; s == SHARD_OK && mp->to != SIZE_MAX && j < j_hi; j++) {
        s = read_old(c, k, j);
        if (s == SHARD_OK &&
            (held_runs(c->desc[((size_t)c->me * 2 + 1) * c->n + k], j, &c->held_new) < 0 ||
             !runs_cut(&c->held_new, &c->held_old, 1, &c->both)))
            s = shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
        if (s < 0) break;
        size_t piece_n = shard__trainer_piece_numel(c->to, mp->to);
        if (piece_n) memset(c->new_piece, 0, piece_n * sizeof(float));
        for (size_t r = 0; r < c->both.n; r++) /* held in both layouts: nothing travels */
            copy_elems(&c->held_old, c->old_piece, NULL, &c->held_new, c->new_piece, NULL, c->both.v[r].g,
                       c->both.v[r].n);
        for (size_t m = 0; m < tp->n_recvs; m++)
            if (tp->recvs[m].j == j)
                copy_elems(NULL, c->recv, &at[tp->recvs[m].peer], &c->held_new, c->new_piece, NULL, tp->recvs[m].g,
                           tp->recvs[m].n);
        s = shard__trainer_set_piece(c->to, mp->to, j, c->new_piece);
    }
    return s;
}

/* Parameters [lo, hi) (a batch) by their plans: every rank's moves in one all_to_allv over world (none
 * when nothing moves), each peer's part holding the parameters in order, then each array of this rank's
 * new pieces from what it held and what it received.  delta: only the live migration's gradient array
 * (c->delta_j; as bf16 when c->delta_bf16); else every other array. */
static shard_status move_batch(copy *c, size_t lo, size_t hi, shard_comm *world, int delta) {
    size_t W = (size_t)c->world, *sc = calloc(W, sizeof *sc), *rc = calloc(W, sizeof *rc);
    size_t *sd = calloc(W, sizeof *sd), *rd = calloc(W, sizeof *rd), *at = calloc(W, sizeof *at), total = 0;
    shard_status s = sc && rc && sd && rd && at ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    for (size_t k = lo; s == SHARD_OK && k < hi; k++) {
        const tensor_plan *tp = &c->plans[k];
        total += delta ? tp->delta_total : tp->total;
        for (size_t r = 0; r < W; r++)
            sc[r] += delta ? tp->delta_send[r] : tp->send[r], rc[r] += delta ? tp->delta_recv[r] : tp->recv[r];
    }
    for (size_t r = 1; s == SHARD_OK && r < W; r++) sd[r] = sd[r - 1] + sc[r - 1], rd[r] = rd[r - 1] + rc[r - 1];
    if (s == SHARD_OK) memcpy(at, sd, W * sizeof *at);
    for (size_t k = lo; s == SHARD_OK && k < hi; k++) s = pack_sends(c, k, delta, at);
    if (s == SHARD_OK && total) {
        if (delta && c->delta_bf16) {
            narrow_to_bf16(c->send, sd[W - 1] + sc[W - 1]);
            s = shard_comm_all_to_allv(world, c->send, sc, sd, c->recv, rc, rd, SHARD_BF16);
            if (s == SHARD_OK) widen_from_bf16(c->recv, rd[W - 1] + rc[W - 1]);
        } else
            s = shard_comm_all_to_allv(world, c->send, sc, sd, c->recv, rc, rd, SHARD_F32);
    }
    if (s == SHARD_OK) memcpy(at, rd, W * sizeof *at);
    for (size_t k = lo; s == SHARD_OK && k < hi; k++) s = unpack_recvs(c, k, delta, at);
    free(sc), free(rc), free(sd), free(rd), free(at);
    return s;
}

/* The state carries over only to the same optimizer (its state arrays the same). */
static shard_status same_optimizer(const shard_trainer *from, const shard_trainer *to) {
    const shard_optimizer *fo = shard__trainer_optimizer(from), *to_opt = shard__trainer_optimizer(to);
    if (shard_optimizer_state_count(fo) == shard_optimizer_state_count(to_opt) &&
        strcmp(shard_optimizer_name(fo), shard_optimizer_name(to_opt)) == 0)
        return SHARD_OK;
    return shard_error(SHARD_ERR_INVALID_ARG,
                       "migrate: the old trainer's optimizer is %s with %d state arrays, the new one's %s with %d: "
                       "the state carries over only to the same optimizer",
                       shard_optimizer_name(fo), (int)shard_optimizer_state_count(fo), shard_optimizer_name(to_opt),
                       (int)shard_optimizer_state_count(to_opt));
}

/* Collective over world: the copy of `from`'s state to `to` planned (c set up; the caller frees it with
 * copy_free); live: with the gradient as one more array, moved apart (c->delta_j). */
static shard_status copy_plan(copy *c, shard_trainer *from, shard_trainer *to, shard_comm *world, int live,
                              size_t batches) {
    *c = (copy){.from = from,
                .to = to,
                .world = shard_comm_size(world),
                .me = shard_comm_rank(world),
                .delta_j = -1,
                .batches_wanted = batches ? batches : 1};
    int states = (int)shard_optimizer_state_count(shard__trainer_optimizer(from));
    c->arrays = 1 + states + (live != 0);
    if (live) c->delta_j = 1 + states;
    shard_status s = same_optimizer(from, to);
    if (s == SHARD_OK) s = shard__trainer_moved_params(from, to, &c->list, &c->n);
    if (s == SHARD_OK) s = describe_all(c);
    /* a rank that found a mismatch or no memory would leave the others waiting: all agree first, and
     * again once every plan and buffer is made */
    s = agree_all(world, s);
    if (s == SHARD_OK) s = share(c, world);
    if (s == SHARD_OK) s = plan_all(c);
    return agree_all(world, s);
}

/* Collective over world: parameters [lo, hi) moved by their plans (delta: the gradient only), *sent
 * increased by the bytes this rank sent for them (the communicator's count over the moves). */
static shard_status copy_params(copy *c, size_t lo, size_t hi, int delta, shard_comm *world, uint64_t *sent) {
    shard_mesh *mesh = shard__trainer_mesh(c->from);
    uint64_t before = shard_mesh_bytes_sent(mesh);
    shard_status s = SHARD_OK;
    for (size_t b = 0; s == SHARD_OK && b < c->batches; b++) {
        size_t k = c->batch_at[b], end = c->batch_at[b + 1];
        if (k < lo || end > hi) continue; /* lo and hi are batch bounds */
        s = c->plans[k].whole_way ? move_whole(c, k, delta) : move_batch(c, k, end, world, delta);
    }
    *sent += shard_mesh_bytes_sent(mesh) - before;
    return s;
}

/* Collective over world: `from`'s state moved to `to`, *sent the bytes this rank sent for it (the
 * descriptions and agreements before the moves are not in it). */
static shard_status copy_state(shard_trainer *from, shard_trainer *to, shard_comm *world, uint64_t *sent) {
    copy c;
    *sent = 0;
    shard_status s = copy_plan(&c, from, to, world, 0, 8);
    if (s == SHARD_OK) s = copy_params(&c, 0, c.n, 0, world, sent);
    copy_free(&c);
    return s;
}

/* The checks both ways of migrating make of their arguments: the same ranks in the same order. */
static shard_status check_meshes(shard_trainer *old, shard_mesh *new_mesh) {
    shard_comm *world = shard_mesh_comm(shard__trainer_mesh(old)), *to_world = shard_mesh_comm(new_mesh);
    if (shard_comm_size(to_world) != shard_comm_size(world) || shard_comm_rank(to_world) != shard_comm_rank(world))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "migrate: the new mesh spans %d ranks and this is its rank %d; the old one %d ranks, "
                           "this its rank %d: a migration keeps the same ranks in the same order",
                           shard_comm_size(to_world), shard_comm_rank(to_world), shard_comm_size(world),
                           shard_comm_rank(world));
    return SHARD_OK;
}

static shard_status check_stats(const shard_migration_stats *stats, const char *who) {
    if (stats && stats->struct_size < sizeof *stats)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: stats->struct_size %zu: set it to sizeof(shard_migration_stats) (%zu)", who,
                           stats->struct_size, sizeof *stats);
    return SHARD_OK;
}

shard_status shard_trainer_migrate(shard_trainer *old, shard_mesh *new_mesh, const shard_trainer_config *new_config,
                                   shard_trainer **out, shard_migration_stats *stats) {
    if (out) *out = NULL;
    if (!old || !new_mesh || !new_config || !out)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_trainer_migrate: NULL argument");
    SHARD_CHECK(check_stats(stats, "shard_trainer_migrate"));
    SHARD_CHECK(check_meshes(old, new_mesh));
    shard_comm *world = shard_mesh_comm(shard__trainer_mesh(old));
    double t0 = shard__now();
    uint64_t sent = 0;
    shard_trainer *t = NULL;
    shard_status s = agree(world, shard__trainer_create_to_fill(new_mesh, new_config, &t));
    if (s == SHARD_OK) s = agree(world, copy_state(old, t, world, &sent));
    double took[2] = {(shard__now() - t0) * 1e3, (double)sent}, most[2] = {0};
    /* the stats: the slowest rank's time, every rank's bytes */
    if (s == SHARD_OK) s = shard_comm_all_reduce(world, &took[0], &most[0], 1, SHARD_F64, SHARD_OP_MAX);
    if (s == SHARD_OK) s = shard_comm_all_reduce(world, &took[1], &most[1], 1, SHARD_F64, SHARD_OP_SUM);
    if (s < 0) {
        shard_trainer_destroy(t);
        return s;
    }
    if (stats) {
        stats->ms = stats->pause_ms = stats->added_ms = stats->longest_ms = most[0];
        stats->bytes = (uint64_t)most[1], stats->rank_bytes = (uint64_t)took[1], stats->delta_bytes = 0;
    }
    shard_trainer_destroy(old);
    *out = t;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- live migration
 *
 * The same plan with the gradient the update reads as one more array (the old trainer keeps a copy of
 * each update's: shard__trainer_keep_grads), spread over steps so that no step boundary waits long:
 * begin builds the new trainer, the first advance plans the copy, and each further advance sends one
 * piece of the snapshot (whole batches, parameters in order, sized so each step carries about the same
 * bytes: send_piece).  At each advance after the plan, before the next piece, the parameters already
 * sent get the old layout's last update again: its gradient moved by the plan (as bf16 where every
 * rank's is bf16 exactly: gradients reduced in bf16) and the update replayed by the new trainer's
 * optimizer with the same step, learning rate and clip factor (element-wise, so bit for bit what the
 * old one did), on those parameters only: the others are written whole when their piece comes.  Each
 * part ends in one agreement, so a failure anywhere leaves every rank on the old trainer. */
struct shard_migration {
    copy c;
    shard_comm *world;
    shard_trainer *from, *to;   /* the old trainer; the new one (c.to too once planned) */
    int planned;                /* the copy planned (c set up) */
    size_t pieces, piece, sent; /* parameters [0, sent) are in the new trainer, kept up to date */
    size_t total_elems;
    uint64_t replayed; /* the old layout's last step replayed (0: none yet) */
    uint64_t bytes[2]; /* this rank's: the snapshot's, the deltas' */
    double t0;         /* begin's time */
    /* this rank's time in each part (begin, each advance, the switch), ms: the slowest rank's of each
     * are found at the switch, in one collective rather than one a part */
    double *part_ms;
    size_t parts, parts_cap;
};

static void live_free(shard_migration *m, shard_trainer *old, int keep_new) {
    if (!m) return;
    if (old) shard__trainer_keep_grads(old, 0);
    if (!keep_new) shard_trainer_destroy(m->to);
    if (m->planned) copy_free(&m->c);
    free(m->part_ms);
    free(m);
}

/* Collective: the copy planned, as shard_trainer_migrate plans it, with the gradient as one more array. */
static shard_status plan_live(shard_migration *m, shard_trainer *old) {
    shard_status s = agree(m->world, copy_plan(&m->c, old, m->to, m->world, 1, 4 * m->pieces));
    m->planned = 1; /* c set up either way: copy_free undoes it */
    for (size_t k = 0; s == SHARD_OK && k < m->c.n; k++) m->total_elems += m->c.list[k].whole_n;
    return s;
}

/* The next piece of the snapshot (all that is left when `all`), sized so that every step carries about
 * the same bytes: a step sends its piece of the A state arrays and the gradients (d of an array: 1 in
 * f32, 1/2 as bf16) of all sent before, so with f the fraction sent, the piece is (C - d f) / A of
 * the elements for the same C each step: f grows as f' = a f + C / A with a = 1 - d / A, and C is
 * the one that reaches f = 1 with the last piece.  Early pieces are larger, carrying no gradients. */
static shard_status send_piece(shard_migration *m, int all) {
    size_t sent_elems = 0, hi = m->sent, left = m->pieces > m->piece ? m->pieces - m->piece : 1;
    for (size_t k = 0; k < m->sent; k++) sent_elems += m->c.list[k].whole_n;
    double f = m->total_elems ? (double)sent_elems / (double)m->total_elems : 1;
    double A = (double)(m->c.arrays - 1), d = m->c.delta_bf16 ? 0.5 : 1, a = A > d ? 1 - d / A : 0;
    double a_left = pow(a, (double)left), step_c = a_left < 1 ? (1 - a_left * f) * (1 - a) / (1 - a_left) : 1;
    double goal = all || left <= 1 ? 1 : a * f + step_c;
    size_t target = goal >= 1 ? m->total_elems : (size_t)(goal * (double)m->total_elems), before = sent_elems;
    /* whole batches, one at least */
    for (size_t b = 0; b < m->c.batches; b++) {
        size_t k = m->c.batch_at[b], end = m->c.batch_at[b + 1];
        if (k < m->sent) continue;
        if (hi > m->sent && before >= target) break;
        for (; k < end; k++) before += m->c.list[k].whole_n;
        hi = end;
    }
    shard_status s = copy_params(&m->c, m->sent, hi, 0, m->world, &m->bytes[0]);
    if (s == SHARD_OK) m->sent = hi, m->piece++;
    return s;
}

/* This rank's time since t (ms) as the time of the part just done. */
static shard_status part_done(shard_migration *m, double t) {
    if (m->parts == m->parts_cap) {
        size_t cap = m->parts_cap ? 2 * m->parts_cap : 16;
        double *v = realloc(m->part_ms, cap * sizeof *v);
        if (!v) return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
        m->part_ms = v, m->parts_cap = cap;
    }
    m->part_ms[m->parts++] = (shard__now() - t) * 1e3;
    return SHARD_OK;
}

shard_status shard_trainer_migrate_begin(shard_trainer *old, shard_mesh *new_mesh,
                                         const shard_trainer_config *new_config, size_t steps, shard_migration **out) {
    if (out) *out = NULL;
    if (!old || !new_mesh || !new_config || !out)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_trainer_migrate_begin: NULL argument");
    if (steps == 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_trainer_migrate_begin: steps is 0: give 1 or more");
    SHARD_CHECK(check_meshes(old, new_mesh));
    shard_migration *m = calloc(1, sizeof *m);
    if (!m) return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    m->world = shard_mesh_comm(shard__trainer_mesh(old)), m->from = old;
    m->pieces = steps > 1 ? steps - 1 : 1;
    /* each part's time counts from when every rank is in it: ranks leave a step at different times,
     * and that wait is the step's (the next step's first collective would wait for it as well) */
    shard_status s = agree(m->world, SHARD_OK);
    m->t0 = shard__now();
    if (s == SHARD_OK) {
        s = shard__trainer_create_to_fill(new_mesh, new_config, &m->to);
        if (s == SHARD_OK) s = same_optimizer(old, m->to);
        if (s == SHARD_OK) s = shard__trainer_keep_grads(old, 1);
        s = agree(m->world, s);
    }
    if (s == SHARD_OK) s = part_done(m, m->t0);
    if (s < 0) {
        live_free(m, old, 0);
        return s;
    }
    *out = m;
    return SHARD_OK;
}

/* Collective over the new trainer's data axes: the old layout's last update replayed on the parameters
 * sent so far (the others are written whole when their piece comes). */
static shard_status replay_sent(shard_migration *m, uint64_t step, float lr, float clip) {
    size_t *held = malloc((m->sent + 1) * sizeof *held), n = 0;
    if (!held) return shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    for (size_t k = 0; k < m->sent; k++)
        if (m->c.list[k].to != SIZE_MAX) held[n++] = m->c.list[k].to;
    shard_status s = shard__trainer_replay(m->to, step, lr, clip, held, n);
    free(held);
    return s;
}

shard_status shard_migration_advance(shard_migration *m, shard_trainer *old) {
    if (!m || !old || m->from != old)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_migration_advance: give the migration and the trainer it began from");
    uint64_t step = 0;
    float lr = 0, clip = 0;
    shard__trainer_kept(old, &step, &lr, &clip);
    shard_status s = SHARD_OK;
    if (step == 0 || (m->replayed && step != m->replayed + 1))
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "migrate: the old layout's last step is %llu, the last one replayed %llu: advance after each "
                        "step, once",
                        (unsigned long long)step, (unsigned long long)m->replayed);
    /* with the agreement, whether every rank's kept gradients are bf16 exactly (then they travel so) */
    int32_t bf16 = shard__trainer_kept_is_bf16(old);
    s = agree_and(m->world, s, &bf16);
    double t = shard__now();          /* every rank here (begin says why) */
    if (s == SHARD_OK && !m->planned) /* the first advance plans: nothing is sent yet, nothing to replay */
        s = plan_live(m, old);
    else if (s == SHARD_OK) { /* the gradients of what went before, their update, the next piece; agreed once */
        m->c.delta_bf16 = bf16;
        s = copy_params(&m->c, 0, m->sent, 1, m->world, &m->bytes[1]);
        if (s == SHARD_OK) s = replay_sent(m, step, lr, clip);
        if (s == SHARD_OK && m->sent < m->c.n) s = send_piece(m, 0);
        s = agree(m->world, s);
    }
    if (s == SHARD_OK) s = part_done(m, t);
    if (s < 0) {
        live_free(m, old, 0);
        return s;
    }
    m->replayed = step;
    return SHARD_OK;
}

size_t shard_migration_steps_left(const shard_migration *m) {
    if (!m) return 0;
    return (m->planned ? 0 : 1) + (m->planned && m->sent >= m->c.n ? 0 : m->pieces - m->piece);
}

shard_status shard_migration_finish(shard_migration *m, shard_trainer *old, shard_trainer **out,
                                    shard_migration_stats *stats) {
    if (out) *out = NULL;
    if (!m || !old || !out || m->from != old)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_migration_finish: give the migration, the trainer it began from and an out pointer");
    SHARD_CHECK(check_stats(stats, "shard_migration_finish"));
    shard_status s = agree(m->world, SHARD_OK);
    double t = shard__now();                                 /* every rank here (begin says why) */
    if (s == SHARD_OK && !m->planned) s = plan_live(m, old); /* finished early: the rest at the switch */
    if (s == SHARD_OK && m->sent < m->c.n) s = agree(m->world, send_piece(m, 1));
    if (s == SHARD_OK) s = part_done(m, t);
    /* the slowest rank's time of each part and in all; every rank's bytes */
    size_t P = m->parts;
    double *most = calloc(P + 1, sizeof *most), *mine = malloc((P + 1) * sizeof *mine), sum[2] = {0};
    double bytes[2] = {(double)m->bytes[0] + (double)m->bytes[1], (double)m->bytes[1]};
    if (s == SHARD_OK && (!most || !mine)) s = shard_error(SHARD_ERR_NO_MEMORY, "migrate: out of memory");
    if (s == SHARD_OK) {
        memcpy(mine, m->part_ms, P * sizeof *mine);
        mine[P] = (shard__now() - m->t0) * 1e3;
        s = shard_comm_all_reduce(m->world, mine, most, P + 1, SHARD_F64, SHARD_OP_MAX);
    }
    if (s == SHARD_OK) s = shard_comm_all_reduce(m->world, bytes, sum, 2, SHARD_F64, SHARD_OP_SUM);
    if (s < 0) {
        free(most), free(mine);
        live_free(m, old, 0);
        return s;
    }
    if (stats) {
        double added = 0, longest = 0;
        for (size_t k = 0; k < P; k++) added += most[k], longest = most[k] > longest ? most[k] : longest;
        stats->ms = most[P], stats->pause_ms = most[P - 1], stats->added_ms = added, stats->longest_ms = longest;
        stats->bytes = (uint64_t)sum[0], stats->delta_bytes = (uint64_t)sum[1];
        stats->rank_bytes = (uint64_t)bytes[0];
    }
    free(most), free(mine);
    *out = m->to;
    live_free(m, old, 1);
    shard_trainer_destroy(old);
    return SHARD_OK;
}

void shard_migration_cancel(shard_migration *m, shard_trainer *old) { live_free(m, old, 0); }
