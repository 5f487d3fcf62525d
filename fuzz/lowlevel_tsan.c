/* The compiled daemon's concurrent read path under ThreadSanitizer.
 *
 *   lowlevel-tsan [--seconds N] [--threads T] ARCHIVE-OR-DIRECTORY...
 *
 * libfuse serves requests on several worker threads over one Tree.  Here, round after
 * round, each archive given (the seeds, and the fuzzer's corpus: damaged records, the
 * piece CRCs of a file over 1 MiB, hostile tables) gets a fresh Tree, checksums "once",
 * and T threads walk it at the same moment (daemon.h's walk_tree: every listing,
 * lookup, read, readlink and attribute request, each reply checked), the first half
 * in the same order, so that they ask for the same record, piece and table page at
 * once (the check-once bitmaps, the stripe locks, the piece path, format 1.4's page
 * checks as the archive's page plan gives them: daemon.h's page_geometry), the others rotated so
 * they meet anywhere.  Every fourth round one more thread truncates the archive's file
 * in the middle of it (tree_changed's sticky flag, set while others read).  Every other
 * round, half the threads walk a forest of that Tree and a second one over the same
 * archive, whose root both hold (daemon.h: walk_forest), while the others walk the Tree.
 *
 * ThreadSanitizer reports each race it sees; fuzz/campaign.py counts them.  The last
 * line says what ran: rounds, archives, requests.
 */

#include "daemon.h"

#include <time.h>

typedef struct {
    Walk walk;
    pthread_barrier_t *start;
    Forest *forest;                /* walk this forest (whose first tree is the walk's) instead */
} Worker;

static void *work(void *argument)
{
    Worker *worker = argument;
    pthread_barrier_wait(worker->start);
    if (worker->forest != NULL)
        walk_forest(&worker->walk, worker->forest, worker->walk.variant);
    else
        walk_tree(&worker->walk);
    return NULL;
}

typedef struct {
    pthread_barrier_t *start;
    size_t size;
    unsigned delay_us;
} Truncation;

static void *truncate_midway(void *argument)
{
    Truncation *truncation = argument;
    pthread_barrier_wait(truncation->start);
    usleep(truncation->delay_us);
    if (ftruncate(archive_fd(NULL, 0), (off_t) (truncation->size / 2)) != 0)
        violation("ftruncate: %s", strerror(errno));
    return NULL;
}

typedef struct {
    char **paths;
    size_t count, room;
} Archives;

static void add(Archives *archives, const char *path)
{
    if (archives->count == archives->room) {
        archives->room = archives->room ? 2 * archives->room : 64;
        archives->paths = realloc(archives->paths, archives->room * sizeof *archives->paths);
        if (archives->paths == NULL)
            violation("out of memory");
    }
    archives->paths[archives->count++] = strdup(path);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *) a, *(char *const *) b);
}

/* A file, or every file in a directory (sorted, for the same order each run). */
static void gather(Archives *archives, const char *path)
{
    DIR *directory = opendir(path);
    if (directory == NULL) {
        add(archives, path);
        return;
    }
    size_t first = archives->count;
    struct dirent *item;
    while ((item = readdir(directory)) != NULL) {
        if (item->d_name[0] == '.')
            continue;
        char joined[4096];
        snprintf(joined, sizeof joined, "%s/%s", path, item->d_name);
        add(archives, joined);
    }
    closedir(directory);
    qsort(archives->paths + first, archives->count - first, sizeof *archives->paths, by_name);
}

static uint8_t *load(const char *path, size_t *size)
{
    FILE *file = fopen(path, "rb");
    if (file == NULL)
        return NULL;
    fseek(file, 0, SEEK_END);
    long length = ftell(file);
    fseek(file, 0, SEEK_SET);
    uint8_t *data = length > 0 ? malloc((size_t) length) : NULL;
    if (data != NULL && fread(data, 1, (size_t) length, file) != (size_t) length) {
        free(data);
        data = NULL;
    }
    fclose(file);
    *size = (size_t) length;
    return data;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double seconds = 60;
    int threads = 4;
    Archives archives = {0};
    for (int k = 1; k < argc; k++) {
        if (strcmp(argv[k], "--seconds") == 0 && k + 1 < argc)
            seconds = atof(argv[++k]);
        else if (strcmp(argv[k], "--threads") == 0 && k + 1 < argc)
            threads = atoi(argv[++k]);
        else
            gather(&archives, argv[k]);
    }
    if (archives.count == 0 || threads < 2 || threads > 64) {
        fprintf(stderr, "usage: %s [--seconds N] [--threads 2..64] ARCHIVE-OR-DIRECTORY...\n", argv[0]);
        return 2;
    }
    daemon_setup();
    double started = now();
    unsigned long long rounds = 0, served = 0, truncated = 0, requests = 0, forests = 0;
    char *tried = calloc(archives.count, 1);
    for (size_t next = 0; now() - started < seconds; next = (next + 1) % archives.count) {
        size_t size;
        uint8_t *data = load(archives.paths[next], &size);
        Layout layout;
        Pages pages;
        Served opened = {0};
        int archive = data != NULL && layout_of(data, size, &layout);
        int paged = archive && page_geometry(data, size, &layout, &pages);
        Tree *t = archive && serve(&opened, data, size, &layout, 1, paged && !pages.hostile ? &pages : NULL)
                  ? opened.tree : NULL;
        rounds++;
        Served second = {0};
        PyObject *forest = NULL;
        if (t != NULL && rounds % 2 == 0) {
            keep_archive_file = 1;  /* the memfd as it is: written again, its mtime would be a change */
            if (serve(&second, data, size, &layout, 1, NULL))
                forest = forest_of_two(t, second.tree);
            keep_archive_file = 0;
        }
        if (t != NULL) {
            served++;
            tried[next] = 1;
            pthread_barrier_t start;
            int truncating = rounds % 4 == 0;
            pthread_barrier_init(&start, NULL, (unsigned) (threads + truncating));
            Worker *workers = calloc((size_t) threads, sizeof *workers);
            pthread_t *ids = calloc((size_t) threads + 1, sizeof *ids);
            for (int k = 0; k < threads; k++) {
                workers[k].walk = (Walk){.data = data, .size = size, .tree = t,
                                         .variant = k < threads / 2 ? 0 : (unsigned) (k * 7)};
                workers[k].start = &start;
                workers[k].forest = forest != NULL && k % 2 ? &((ForestObject *) forest)->forest : NULL;
                pthread_create(&ids[k], NULL, work, &workers[k]);
            }
            Truncation truncation = {&start, size, (unsigned) (rounds * 7919 % 2000)};
            if (truncating) {
                pthread_create(&ids[threads], NULL, truncate_midway, &truncation);
                truncated++;
            }
            for (int k = 0; k < threads + truncating; k++)
                pthread_join(ids[k], NULL);
            for (int k = 0; k < threads; k++)
                requests += workers[k].walk.operations;
            forests += forest != NULL;
            pthread_barrier_destroy(&start);
            free(workers);
            free(ids);
        }
        Py_XDECREF(forest);
        unserve(&second);
        unserve(&opened);
        if (paged)
            pages_free(&pages);
        free(data);
    }
    size_t distinct = 0;
    for (size_t k = 0; k < archives.count; k++)
        distinct += tried[k];
    printf("lowlevel-tsan: %llu rounds in %.0f s with %d threads: %llu served (%zu distinct archives of %zu given, "
           "%llu truncated midway, %llu also as a forest of two), %llu requests\n", rounds, now() - started, threads,
           served, distinct, archives.count, truncated, forests, requests);
    return 0;
}
