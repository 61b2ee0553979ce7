/* simd.h — internal: element-wise kernels are compiled several times, for
 * x86-64-v4 (AVX-512), v3 (AVX2 + FMA) and the baseline, and the loader
 * picks the best the CPU has (GCC/Clang target_clones), so one portable
 * binary runs its loops at the machine's vector width. */
#ifndef SHARD_SIMD_H
#define SHARD_SIMD_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(SHARD_NO_CLONES)
#define SHARD_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SHARD_VECTOR_CLONES
#endif

#endif
