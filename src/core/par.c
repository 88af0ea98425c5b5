/* What a parallel region costs on this machine (core/par.h). */
#include "core/par.h"
#include "core/core.h"

#include <stdatomic.h>
#include <stdlib.h>

enum { PAR_MAX_TEAM = 256, PAR_ROUNDS = 3, PAR_REGIONS = 32 };

/* Per team size, in nanoseconds (0: not measured yet). Written once each;
 * a race measures twice and keeps either. */
static _Atomic long par_ns[PAR_MAX_TEAM + 1];

/* One region with one barrier inside, as a product whose threads share
 * their input's preparation has. */
static void par_region(int nt) {
#pragma omp parallel num_threads(nt)
    {
#pragma omp barrier
    }
}

/* WHALE_PAR_US as microseconds: 1 when set to a number in (0, 1e6), with
 * *us; 0 when unset or empty; -1 when set to anything else. */
static int par_env(double *us) {
    const char *env = getenv("WHALE_PAR_US");
    if (!env || !*env) return 0;
    char *end;
    *us = strtod(env, &end);
    return *end == 0 && *us > 0 && *us < 1e6 ? 1 : -1;
}

whale_code whale_par_init(whale_err *err) {
    double us;
    if (par_env(&us) < 0)
        return whale_errf(err, WHALE_ERR_ARG, "WHALE_PAR_US=%.40s is not a number of microseconds above 0 and below 1e6",
                          getenv("WHALE_PAR_US"));
    return WHALE_OK;
}

static long par_measure(int nt) {
    double us;
    if (par_env(&us) > 0) /* a fixed cost: the same splits on every run */
        return (long)(us * 1e3) > 0 ? (long)(us * 1e3) : 1;
    for (int i = 0; i < PAR_REGIONS; i++) par_region(nt); /* wake the team */
    double best = 0;
    for (int r = 0; r < PAR_ROUNDS; r++) {
        const double t0 = whale_now();
        for (int i = 0; i < PAR_REGIONS; i++) par_region(nt);
        const double t = (whale_now() - t0) / PAR_REGIONS;
        if (!r || t < best) best = t;
    }
    const long ns = (long)(best * 1e9);
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

int whale_par_worth(double one_thread_us, double regions) {
    const double us = whale_par_sync_us();
    return us > 0 && one_thread_us >= 2 * regions * us;
}
