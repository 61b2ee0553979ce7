/* alloc.c — 64-byte aligned allocation with per-rank, per-category accounting.
 *
 * Each block carries a small header in front of the aligned pointer recording
 * its size, category and ledger, so that shard_free credits the right rank even
 * when another thread frees it.  Counters are atomics: a rank and its helper
 * thread may allocate at the same time.
 *
 * Blocks of 4 MiB and more (activations, parameter slabs, optimizer state)
 * start on a 2 MiB boundary and ask the kernel for transparent huge pages
 * (madvise; Debian's default THP mode is "madvise"): the GEMMs' packing
 * walks big matrices with strides of a few KiB, one 4 KiB page per row
 * otherwise. */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "alloc_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shard/files.h"

enum { HUGE_PAGE = 2u << 20, HUGE_FROM = 4u << 20 };

#define BLOCK_MAGIC 0x5348415244414c4cULL /* "SHARDALL" */

typedef struct block_header {
    uint64_t magic;
    uint64_t bytes;
    shard__mem_ledger *ledger;
    void *raw;
    int category;
    int planned; /* mapped by the plan mode (a large block): unmapped on free */
    char pad[SHARD_ALIGNMENT_BYTES - 2 * sizeof(uint64_t) - 2 * sizeof(void *) - 2 * sizeof(int)];
} block_header;

_Static_assert(sizeof(block_header) == SHARD_ALIGNMENT_BYTES, "header must keep alignment");

static shard__mem_ledger process_ledger;
static _Thread_local shard__mem_ledger *thread_ledger;
static _Thread_local int plan_mode;

void shard__mem_plan_mode(int on) { plan_mode = on; }
int shard__mem_planning(void) { return plan_mode; }

/* A planned block: pages the kernel hands out only when written (MAP_NORESERVE), the header in the first
 * page, the data from the second; zero-filled as mapped.  Blocks under PLAN_MAP_FROM come from the heap
 * instead: a map and an unmap per small block (thousands a dry run, each unmap stopping every thread of
 * the process to flush its mappings) cost far more than the few pages they would leave untouched. */
enum { PLAN_MAP_FROM = 1 << 20 };
static void *map_planned(size_t bytes, void **raw, size_t *mapped) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    *mapped = (bytes + 2 * page - 1) / page * page;
    void *at = mmap(NULL, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED) return NULL;
    *raw = at;
    return (char *)at + page;
}

shard__mem_ledger *shard__mem_ledger_current(void) { return thread_ledger ? thread_ledger : &process_ledger; }

void shard__mem_ledger_adopt(shard__mem_ledger *ledger) { thread_ledger = ledger; }

void shard__mem_ledger_init(shard__mem_ledger *ledger) {
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++) {
        atomic_init(&ledger->current_bytes[c], 0);
        atomic_init(&ledger->peak_bytes[c], 0);
        atomic_init(&ledger->window_peak_bytes[c], 0);
    }
    atomic_init(&ledger->total_current_bytes, 0);
    atomic_init(&ledger->blocks, 0);
    atomic_init(&ledger->total_peak_bytes, 0);
    ledger->limit_bytes = 0;
    ledger->limit_owner[0] = '\0';
}

void shard__mem_ledger_limit(shard__mem_ledger *ledger, uint64_t limit_bytes, const char *owner) {
    ledger->limit_bytes = limit_bytes;
    snprintf(ledger->limit_owner, sizeof ledger->limit_owner, "%s", owner ? owner : "");
}

/* An allocation past the ledger's emulated device memory: refused, naming who, what and how much. */
static int over_limit(const shard__mem_ledger *ledger, size_t bytes, shard_mem_category category) {
    uint64_t held = atomic_load_explicit(&ledger->total_current_bytes, memory_order_relaxed);
    if (held + bytes <= ledger->limit_bytes) return 0;
    char want[32], have[32], limit[32];
    shard__mem_bytes_text((double)bytes, want, sizeof want);
    shard__mem_bytes_text((double)held, have, sizeof have);
    shard__mem_bytes_text((double)ledger->limit_bytes, limit, sizeof limit);
    shard__error_memory_cause(""); /* this refusal replaces an earlier one */
    shard_error(SHARD_ERR_NO_MEMORY,
                "%s is out of device memory: %zu bytes (%s) more of %s on the %s it holds would pass its "
                "available_memory_gb (%s); give the node more memory, or a layout that holds less per rank (more "
                "ranks, --zero, --recompute)",
                ledger->limit_owner, bytes, want, shard_mem_category_name(category), have, limit);
    shard__error_memory_cause(shard_last_error());
    return 1;
}

const char *shard_mem_category_name(shard_mem_category category) {
    static const char *names[SHARD_MEM_CATEGORY_COUNT] = {"params",      "grads", "optimizer",
                                                          "activations", "comm",  "other"};
    if ((int)category < 0 || category >= SHARD_MEM_CATEGORY_COUNT) return "invalid";
    return names[category];
}

static void raise_peak(_Atomic uint64_t *peak, uint64_t value) {
    uint64_t seen = atomic_load_explicit(peak, memory_order_relaxed);
    while (value > seen &&
           !atomic_compare_exchange_weak_explicit(peak, &seen, value, memory_order_relaxed, memory_order_relaxed)) {}
}

static void charge(shard__mem_ledger *ledger, int category, uint64_t bytes) {
    uint64_t now = atomic_fetch_add(&ledger->current_bytes[category], bytes) + bytes;
    raise_peak(&ledger->peak_bytes[category], now);
    raise_peak(&ledger->window_peak_bytes[category], now);
    uint64_t total = atomic_fetch_add(&ledger->total_current_bytes, bytes) + bytes;
    raise_peak(&ledger->total_peak_bytes, total);
}

/* shard_alloc and shard_alloc_zeroed: zeroed asks for zeros, which calloc gives a small block without
 * touching pages fresh from the kernel (they are zero already: the page faults come at first use,
 * where they spread over the work instead of all at once here); a huge block is cleared here. */
static void *alloc_block(size_t bytes, shard_mem_category category, int zeroed) {
    if ((int)category < 0 || category >= SHARD_MEM_CATEGORY_COUNT) {
        shard_error(SHARD_ERR_INVALID_ARG, "shard_alloc: category %d is not one of 0..%d", (int)category,
                    SHARD_MEM_CATEGORY_COUNT - 1);
        return NULL;
    }
    if (bytes > SIZE_MAX - 2 * SHARD_ALIGNMENT_BYTES) {
        shard_error(SHARD_ERR_NO_MEMORY, "shard_alloc: %zu bytes is more than can be addressed", bytes);
        return NULL;
    }
    shard__mem_ledger *ledger = shard__mem_ledger_current();
    if (ledger->limit_bytes && !plan_mode && over_limit(ledger, bytes, category)) return NULL;
    size_t raw_bytes = bytes + 2 * SHARD_ALIGNMENT_BYTES;
    void *raw = NULL;
    uintptr_t aligned;
    int mapping = plan_mode && bytes >= PLAN_MAP_FROM, huge = 0;
    if (mapping) {
        size_t mapped;
        void *data = map_planned(bytes, &raw, &mapped);
        aligned = (uintptr_t)data;
        if (!data) raw = NULL;
    } else if (bytes >= HUGE_FROM && bytes <= SIZE_MAX - 2 * (size_t)HUGE_PAGE) {
        /* the data on a 2 MiB boundary, the header in the page before it (the only page touched there) */
        size_t data_bytes = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        raw = aligned_alloc(HUGE_PAGE, data_bytes + HUGE_PAGE);
        aligned = (uintptr_t)raw + HUGE_PAGE, huge = 1;
#ifdef MADV_HUGEPAGE
        if (raw) (void)madvise((void *)aligned, data_bytes, MADV_HUGEPAGE); /* a hint: refused harmlessly without THP */
#endif
    } else {
        raw = plan_mode || zeroed ? calloc(1, raw_bytes) : malloc(raw_bytes); /* a small planned block: zeros too */
        aligned = ((uintptr_t)raw + 2 * SHARD_ALIGNMENT_BYTES - 1) & ~(uintptr_t)(SHARD_ALIGNMENT_BYTES - 1);
    }
    if (!raw) {
        shard_error(SHARD_ERR_NO_MEMORY, "shard_alloc: out of memory allocating %zu bytes of %s", bytes,
                    shard_mem_category_name(category));
        return NULL;
    }
    block_header *h = (block_header *)(aligned - sizeof(block_header));
    memset(h, 0, sizeof *h);
    h->magic = BLOCK_MAGIC;
    h->bytes = bytes;
    h->ledger = ledger;
    h->raw = raw;
    h->category = (int)category;
    h->planned = mapping;
    charge(h->ledger, h->category, bytes);
    atomic_fetch_add(&h->ledger->blocks, 1);
    if (zeroed && huge) memset((void *)aligned, 0, bytes);
    return (void *)aligned;
}

void *shard_alloc(size_t bytes, shard_mem_category category) { return alloc_block(bytes, category, 0); }

void *shard_alloc_zeroed(size_t bytes, shard_mem_category category) { return alloc_block(bytes, category, 1); }

void shard_free(void *ptr) {
    if (!ptr) return;
    block_header *h = (block_header *)((uintptr_t)ptr - sizeof(block_header));
    if (h->magic != BLOCK_MAGIC) abort(); /* not ours or double free: memory is corrupt */
    h->magic = 0;
    atomic_fetch_sub(&h->ledger->current_bytes[h->category], h->bytes);
    atomic_fetch_sub(&h->ledger->total_current_bytes, h->bytes);
    atomic_fetch_sub(&h->ledger->blocks, 1); /* the last touch of the ledger: it may be freed from now on */
    if (h->planned) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        munmap(h->raw, (h->bytes + 2 * page - 1) / page * page);
    } else {
        free(h->raw);
    }
}

void shard_mem_stats_get(shard_mem_stats *out) {
    shard__mem_ledger *l = shard__mem_ledger_current();
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++) {
        out->current_bytes[c] = atomic_load(&l->current_bytes[c]);
        out->peak_bytes[c] = atomic_load(&l->peak_bytes[c]);
    }
    out->total_current_bytes = atomic_load(&l->total_current_bytes);
    out->total_peak_bytes = atomic_load(&l->total_peak_bytes);
}

void shard_mem_stats_reset_peak(void) {
    shard__mem_ledger *l = shard__mem_ledger_current();
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++)
        atomic_store(&l->peak_bytes[c], atomic_load(&l->current_bytes[c]));
    atomic_store(&l->total_peak_bytes, atomic_load(&l->total_current_bytes));
}

void shard__mem_window_reset(void) {
    shard__mem_ledger *l = shard__mem_ledger_current();
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++)
        atomic_store(&l->window_peak_bytes[c], atomic_load(&l->current_bytes[c]));
}

void shard__mem_window_get(uint64_t peak_bytes[SHARD_MEM_CATEGORY_COUNT]) {
    shard__mem_ledger *l = shard__mem_ledger_current();
    for (int c = 0; c < SHARD_MEM_CATEGORY_COUNT; c++) peak_bytes[c] = atomic_load(&l->window_peak_bytes[c]);
}

uint64_t shard__mem_available_bytes(void) {
    if (plan_mode) return 0; /* a plan takes no memory: nothing is refused for want of it */
    char *text = NULL;
    uint64_t kib = 0;
    if (shard_file_read("/proc/meminfo", "cannot read", 1 << 20, &text, NULL) == SHARD_OK) {
        const char *at = strstr(text, "MemAvailable:");
        if (at) kib = strtoull(at + strlen("MemAvailable:"), NULL, 10);
        free(text);
    } else {
        shard_clear_error(); /* a system without /proc is no error: the figure below stands in */
    }
    if (kib) return kib * 1024;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

void shard__mem_bytes_text(double bytes, char *out, size_t out_bytes) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(out, out_bytes, "%.0f bytes", bytes);
        return;
    }
    int u = 0;
    for (bytes /= 1024; bytes >= 1024 && u < 5; u++) bytes /= 1024;
    snprintf(out, out_bytes, "%.1f %s", bytes, units[u]);
}
