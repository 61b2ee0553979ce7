/* fuzz_safetensors.c — libFuzzer harness for the safetensors reader: any
 * bytes must either be refused with an error or give entries whose data lies
 * inside the buffer, without crashing, leaking or reading out of bounds
 * (built with ASan + UBSan; see scripts/test.sh).  Seeds:
 * tests/fuzz/safetensors_seeds (the malformed corpus and valid files). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shard/safetensors.h"

volatile unsigned fuzz_sink; /* keeps the reads of every data byte */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a copy of exactly `size` bytes, so ASan sees any read past the end */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    shard_safetensors *f = NULL;
    if (shard_safetensors_parse(copy, size, "fuzz", &f) == SHARD_OK) {
        unsigned sum = 0;
        for (size_t i = 0; i < shard_safetensors_count(f); i++) {
            const shard_st_entry *e = shard_safetensors_entry(f, i);
            const uint8_t *bytes = shard_safetensors_data(f, e);
            for (uint64_t b = 0; b < e->end - e->begin; b++) sum += bytes[b]; /* every byte readable */
            if (shard_safetensors_find(f, e->name) != e) abort();
            shard_tensor *t = NULL;
            if (shard_safetensors_tensor(f, e->name, SHARD_MEM_OTHER, &t, NULL) == SHARD_OK) {
                if (shard_tensor_nbytes(t) != e->end - e->begin) abort();
                shard_tensor_destroy(t);
            }
        }
        for (size_t i = 0; i < shard_safetensors_metadata_count(f); i++) {
            const char *k, *v;
            shard_safetensors_metadata_pair(f, i, &k, &v);
            if (shard_safetensors_metadata(f, k) == NULL) abort();
            sum += (unsigned)strlen(v);
        }
        fuzz_sink = sum;
        shard_safetensors_close(f);
    }
    free(copy);
    return 0;
}
