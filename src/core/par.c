/* What a parallel region costs on this machine (core/par.h). */
#include "core/par.h"
#include "core/core.h"

#include <stdatomic.h>
#include <stdlib.h>

enum { PAR_MAX_TEAM = 256, PAR_ROUNDS = 3, PAR_REGIONS = 32 };

/* Per team size, in nanoseconds, what a region costs (0: not measured
 * yet); moving 64 KiB, plus 1 (0: not read yet). Written once each; a race
 * measures twice and keeps either. */
static _Atomic long par_ns[PAR_MAX_TEAM + 1], par_move_ns;

/* One region with one barrier inside, as a product whose threads share
 * their input's preparation has. */
static void par_region(int nt) {
#pragma omp parallel num_threads(nt)
    {
#pragma omp barrier
    }
}

/* The environment variable `name` as microseconds: 1 when set to a number
 * above 0 (or 0 too, with zero_ok) and below 1e6, with *us; 0 when unset
 * or empty; -1 when set to anything else. */
static int par_env(const char *name, int zero_ok, double *us) {
    const char *env = getenv(name);
    if (!env || !*env) return 0;
    char *end;
    *us = strtod(env, &end);
    return *end == 0 && (zero_ok ? *us >= 0 : *us > 0) && *us < 1e6 ? 1 : -1;
}

whale_code whale_par_init(whale_err *err) {
    double us;
    if (par_env("WHALE_PAR_US", 0, &us) < 0)
        return whale_errf(err, WHALE_ERR_ARG, "WHALE_PAR_US=%.40s is not a number of microseconds above 0 and below 1e6",
                          getenv("WHALE_PAR_US"));
    if (par_env("WHALE_PAR_MOVE_US", 1, &us) < 0)
        return whale_errf(err, WHALE_ERR_ARG,
                          "WHALE_PAR_MOVE_US=%.40s is not a number of microseconds from 0 to below 1e6",
                          getenv("WHALE_PAR_MOVE_US"));
    return WHALE_OK;
}

/* Seconds a region takes, best of PAR_ROUNDS. */
static double par_time(int nt) {
    double best = 0;
    for (int r = 0; r < PAR_ROUNDS; r++) {
        const double t0 = whale_now();
        for (int i = 0; i < PAR_REGIONS; i++) par_region(nt);
        const double t = (whale_now() - t0) / PAR_REGIONS;
        if (!r || t < best) best = t;
    }
    return best;
}

/* What a region costs, in nanoseconds (at least 1): measured, or as
 * WHALE_PAR_US fixes it. */
static long par_measure(int nt) {
    double us;
    if (par_env("WHALE_PAR_US", 0, &us) > 0) /* fixed: the same splits on every run */
        return (long)(us * 1e3) > 0 ? (long)(us * 1e3) : 1;
    for (int i = 0; i < PAR_REGIONS; i++) par_region(nt); /* wake the team */
    const long ns = (long)(par_time(nt) * 1e9);
    return ns > 0 ? ns : 1;
}

double whale_par_sync_us(void) {
    const int nt = omp_get_max_threads();
    if (nt <= 1 || omp_in_parallel()) return 0;
    const int slot = nt < PAR_MAX_TEAM ? nt : PAR_MAX_TEAM;
    long ns = atomic_load_explicit(&par_ns[slot], memory_order_relaxed);
    if (!ns) {
        ns = par_measure(nt);
        atomic_store_explicit(&par_ns[slot], ns, memory_order_relaxed);
    }
    return (double)ns * 1e-3;
}

/* A line another core holds arrives about as fast as one from memory (a
 * 2-core Zen 5 virtual machine: 27-32 GB/s read after the other core wrote
 * 32-512 KiB, one core streaming 29 from memory), so 64 KiB cost what
 * WHALE_CORE_BYTES_PER_US says, unless WHALE_PAR_MOVE_US fixes it.
 * Microseconds per byte, read once. */
static double par_move_us_per_byte(void) {
    long ns = atomic_load_explicit(&par_move_ns, memory_order_relaxed);
    if (!ns) {
        double us;
        ns = 1 + (par_env("WHALE_PAR_MOVE_US", 1, &us) > 0 ? (long)(us * 1e3) : (long)(65536e3 / WHALE_CORE_BYTES_PER_US));
        atomic_store_explicit(&par_move_ns, ns, memory_order_relaxed);
    }
    return (double)(ns - 1) * 1e-3 / 65536.0;
}

double whale_par_move_us(double bytes) { return whale_par_sync_us() > 0 ? bytes * par_move_us_per_byte() : 0; }

int whale_par_worth(double one_thread_us, double regions, double moved_bytes) {
    const double us = whale_par_sync_us();
    return us > 0 && one_thread_us >= 2 * (regions * us + moved_bytes * par_move_us_per_byte());
}
