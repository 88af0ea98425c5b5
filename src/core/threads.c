/* Thread count for OpenMP regions; oneDNN (built on OpenMP) follows it. */
#include "whale.h"

#include <omp.h>

void whale_set_threads(int n) {
    if (n <= 0) n = omp_get_num_procs();
    omp_set_num_threads(n);
}

int whale_get_threads(void) { return omp_get_max_threads(); }

void whale_threads_release(void) { omp_pause_resource_all(omp_pause_hard); }
