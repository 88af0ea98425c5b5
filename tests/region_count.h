/* Counting the parallel regions the library enters, for a test program
 * linked with -Wl,--wrap=GOMP_parallel (tests/CMakeLists.txt): every
 * `#pragma omp parallel` that gcc compiles calls GOMP_parallel, which the
 * linker sends here first. Include it in one file of the program; read
 * `regions` before and after what is measured. oneDNN's own regions (from
 * libdnnl, linked against the real symbol) are not counted. */
#ifndef WHALE_TEST_REGION_COUNT_H
#define WHALE_TEST_REGION_COUNT_H

void __real_GOMP_parallel(void (*fn)(void *), void *data, unsigned nthreads, unsigned flags);
static long regions;
void __wrap_GOMP_parallel(void (*fn)(void *), void *data, unsigned nthreads, unsigned flags);
void __wrap_GOMP_parallel(void (*fn)(void *), void *data, unsigned nthreads, unsigned flags) {
    __atomic_add_fetch(&regions, 1, __ATOMIC_RELAXED);
    __real_GOMP_parallel(fn, data, nthreads, flags);
}

#endif
