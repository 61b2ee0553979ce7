/* expert_bound.c — see expert_bound.h: a mixture of experts' exchange and activation rows at capacity,
 * and the thread's tally the analyzer reads them from. */
#include "plan/expert_bound.h"

_Thread_local shard__expert_plan *shard__expert_plan_current;

size_t shard__expert_rows_to(size_t set, size_t tokens, size_t top_k, size_t capacity) {
    size_t per_expert = capacity < tokens ? capacity : tokens, picks = top_k < set ? top_k : set;
    size_t filled = set * per_expert, chosen = tokens * picks;
    return filled < chosen ? filled : chosen;
}

static size_t peers_rows(const shard__expert_shape *s, size_t peer_rows) {
    return (size_t)(s->ranks - 1) * (peer_rows ? peer_rows : s->rows) *
        shard__expert_rows_to(s->held, s->tokens, s->top_k, s->capacity);
}

size_t shard__expert_held_bound(const shard__expert_shape *s, size_t peer_rows) {
    return peers_rows(s, peer_rows) + s->rows * shard__expert_rows_to(s->held, s->tokens, s->top_k, s->capacity);
}

uint64_t shard__expert_bytes_bound(const shard__expert_shape *s, size_t peer_rows, int forward) {
    if (s->ranks < 2) return 0; /* every expert here: no exchange */
    size_t sent = s->rows * shard__expert_rows_to(s->experts - s->held, s->tokens, s->top_k, s->capacity);
    uint64_t rows_bytes = (uint64_t)(sent + peers_rows(s, peer_rows)) * s->width * sizeof(float);
    /* the counts: to each other rank two header words and one per expert it holds (int64) */
    uint64_t counts = (uint64_t)(2 * (size_t)(s->ranks - 1) + s->experts - s->held) * sizeof(int64_t);
    return rows_bytes + (forward ? counts : 0);
}

uint64_t shard__expert_activation_bytes(const shard__expert_shape *s, size_t rows) {
    return (uint64_t)rows * 3 * (s->width + s->hidden) * sizeof(float);
}
