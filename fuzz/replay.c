/* A main for the fuzz targets without libFuzzer: runs
 * LLVMFuzzerTestOneInput once on every file named (or found one level
 * inside a folder named) on the command line. The ordinary build links each
 * target with it and replays the committed seed corpus as a test, so a
 * target always compiles against the current code and every seed, crashers
 * once found included, stays a regression test under the sanitizers. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

/* Run the target on one file; 0, or -1 when it cannot be read. */
static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    struct stat st;
    if (fstat(fileno(f), &st) || st.st_size < 0) {
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    /* libFuzzer hands a target a buffer of exactly the input's size */
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every regular file in dir, in name order; the count run, or -1. */
static int replay_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) break;
            names = grown;
        }
        if (!(names[n] = malloc(strlen(dir) + strlen(e->d_name) + 2))) break;
        sprintf(names[n++], "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    int ran = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (!stat(names[i], &st) && S_ISREG(st.st_mode)) {
            if (replay_file(names[i])) {
                fprintf(stderr, "replay: %s: cannot read\n", names[i]);
                ran = -1;
            } else if (ran >= 0) {
                ran++;
            }
        }
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int ran = stat(argv[i], &st) ? -1 : S_ISDIR(st.st_mode) ? replay_dir(argv[i]) : replay_file(argv[i]) ? -1 : 1;
        if (ran < 0) {
            fprintf(stderr, "replay: %s: cannot read\n", argv[i]);
            return 1;
        }
        total += ran;
    }
    if (total == 0) {
        fprintf(stderr, "replay: no inputs\n");
        return 1;
    }
    printf("replay: %d inputs ran\n", total);
    return 0;
}
