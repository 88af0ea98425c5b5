/* whale_threads_release: after a parallel region on this thread its idle
 * OpenMP workers stay alive (the process has more threads than before);
 * released, they are gone, and a region started afterwards, here or on
 * another thread, runs with its full team again. This is what lets a
 * server that loaded its model on the main thread run its engine thread's
 * team as the process's only one (src/serve/engine.c). */
#include "testutil.h"

#include "whale.h"

#include <dirent.h>
#include <omp.h>
#include <pthread.h>
#include <time.h>

/* Threads of this process, from /proc/self/task. */
static int thread_count(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Threads of this process once a release has settled: libgomp's released
 * workers are detached threads that leave after the release returns (and a
 * thread's own team leaves when the thread exits), so the count is polled
 * for up to two seconds until it reaches `want`. */
static int settled_count(int want) {
    int n = thread_count();
    for (int i = 0; i < 200 && n != want; i++) {
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
        n = thread_count();
    }
    return n;
}

/* The team size of one parallel region run here. */
static int region(void) {
    int team = 0;
#pragma omp parallel
    {
#pragma omp single
        team = omp_get_num_threads();
    }
    return team;
}

static void *other_thread(void *arg) {
    *(int *)arg = region();
    return NULL;
}

int main(void) {
    whale_set_threads(2);
    const int before = thread_count();
    CHECK(before >= 1, "no /proc/self/task (%d)", before);
    CHECK(region() == 2, "a region of 2 threads");
    const int with_pool = thread_count();
    CHECK(with_pool == before + 1, "the region's worker stays (threads %d -> %d)", before, with_pool);
    whale_threads_release();
    const int released = settled_count(before);
    CHECK(released == before, "released: %d threads, %d before any region", released, before);
    int team = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, &team) == 0, "a second thread");
    pthread_join(t, NULL);
    CHECK(team == 2, "a region on another thread after the release: team %d", team);
    CHECK(region() == 2, "a region here after the release");
    whale_threads_release();
    const int again = settled_count(before);
    CHECK(again == before, "released again: %d threads, %d before any region", again, before);
    return test_finish("test_threads");
}
