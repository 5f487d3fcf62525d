/* libFuzzer target: the format library alone (packfs/cformat/), with no libfuse, no
 * stubs of it and no Python: an input is a whole archive, opened by tree_open over the
 * spans packfs.core would find (layout.h: layout_of, and format 1.4's page geometry
 * bent by the input's page plan), then read at the table and lookup level:
 *
 *   every entry's attributes (entry_stat); each directory's listing (listing_item,
 *   with attributes), each listed name looked up again (tree_lookup), its path found
 *   by path_hash (tree_find); each file read whole (tree_read: CRCs, pieces, codecs;
 *   and locate_whole_file + read_whole_file, compared with it),
 *   each symlink's target (tree_readlink); the attribute lists (tree_xattrs).
 *
 * A finding is a sanitizer's report (AddressSanitizer: a read outside the buffer that
 * stands in for the map; UBSan: overflow, misaligned or out-of-range values), or one of
 * the library's answers contradicting another: a path that tree_find places at an
 * entry with another path, a file whose
 * read gives another size than its attributes, an errno other than those a reader is
 * promised (EIO, ENOENT, ENAMETOOLONG, EFBIG, ENOMEM, EINVAL, EISDIR, ENOTDIR).
 *
 *   make fuzz-c    # runs this target for a third of FUZZ_C_SECONDS, lowlevel_fuzz.c the rest
 */

#include "layout.h"

#include "../packfs/cformat/codecs.h"
#include "../packfs/cformat/lookup.h"
#include "../packfs/cformat/records.h"
#include "../packfs/cformat/table.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Work per input: the library bounds each operation by the archive; these bound how
 * many an input makes. */
#define MAX_ENTRIES 2048
#define MAX_LISTED 256
#define MAX_READ ((size_t) 4 << 20)

static void finding(const char *what, unsigned long long entry)
{
    fprintf(stderr, "packfs format fuzz: entry %llu: %s\n", entry, what);
    abort();
}

static void allowed(int error, const char *what, uint64_t entry)
{
    switch (error) {
    case 0: case EIO: case ENOENT: case ENAMETOOLONG: case EFBIG: case ENOMEM: case EINVAL: case EISDIR:
    case ENOTDIR: case ENODATA: case ERANGE:
        return;
    default:
        finding(what, entry);
    }
}

/* The stored path of entry ``entry`` (names joined by '/' from the root down), or 0:
 * a name or parent that breaks a rule (the library answered EIO for it). */
static int path_of(Tree *t, uint64_t entry, uint8_t *path, size_t room, size_t *length)
{
    size_t end = room;
    for (unsigned steps = 0; entry != 0; steps++) {
        const uint8_t *name;
        uint64_t name_length;
        if (steps > 64 || name_of(t, entry, &name, &name_length) != 0 || name_length + 1 > end)
            return 0;
        end -= (size_t) name_length;
        memcpy(path + end, name, (size_t) name_length);
        uint64_t parent = COLUMN32(t, PARENT, entry);
        if (parent >= entry)
            return 0;
        if (parent != 0)
            path[--end] = '/';
        entry = parent;
    }
    memmove(path, path + end, room - end);
    *length = room - end;
    return 1;
}

/* The whole-file read (packfs.core._format's read_file and read_path): file ``path``
 * located, then read whole into a buffer of exactly its size (so a byte written past
 * it is reported), and compared with tree_read's answer for the same entry. */
static void read_whole(Tree *t, uint64_t entry, const uint8_t *path, size_t length, const uint8_t *data,
                       size_t got, int read_error)
{
    WholeFile f;
    int error = locate_whole_file(t, path, length, &f);
    if (error || page_failure)
        error = finished(t, error);
    allowed(error, "locate_whole_file answered an errno no reader is promised", entry);
    if (error || f.size > MAX_READ)
        return;
    uint8_t *whole = malloc(f.size ? f.size : 1);
    if (whole == NULL)
        abort();
    error = finished(t, read_whole_file(t, &f, whole));
    allowed(error, "read_whole_file answered an errno no reader is promised", entry);
    /* the same file read both ways: the same bytes (a verdict may differ only where the
     * first read left one, as a record found damaged) */
    if (!error && !read_error && f.entry == entry && (got != f.size || (got && memcmp(whole, data, got) != 0)))
        finding("the whole-file read gives other bytes than tree_read", entry);
    free(whole);
}

static void read_entry(Tree *t, uint64_t entry)
{
    struct stat st;
    int error = finished(t, entry_stat(t, entry, &st));
    allowed(error, "entry_stat answered an errno no reader is promised", entry);
    if (error)
        return;
    uint8_t *data = NULL;
    size_t got = 0, skip = 0;
    int read_error = -1;
    if (S_ISREG(st.st_mode)) {
        error = read_error = finished(t, tree_read(t, entry + 1, 0, MAX_READ, &data, &got, &skip));
        allowed(error, "tree_read answered an errno no reader is promised", entry);
        if (!error && got != ((uint64_t) st.st_size < MAX_READ ? (uint64_t) st.st_size : MAX_READ))
            finding("a file's read gives another size than its attributes", entry);
    } else if (S_ISLNK(st.st_mode)) {
        char target[MAX_SYMLINK_TARGET + 1];
        allowed(finished(t, tree_readlink(t, entry + 1, target)), "tree_readlink", entry);
    } else if (S_ISDIR(st.st_mode)) {
        uint64_t directory, start, count;
        if (finished(t, directory_of(t, entry + 1, &directory, &start, &count)) != 0)
            return;
        for (uint64_t position = 2; position < 2 + count && position < 2 + MAX_LISTED; position++) {
            char name[MAX_NAME + 1];
            struct stat listed;
            int attributes = 0;
            error = finished(t, listing_item(t, directory, start, count, position, 1, name, &listed, &attributes));
            if (error == LEFT_OUT)
                continue;
            allowed(error, "listing_item", entry);
            if (error)
                continue;
            /* Not compared with the listing: a hostile directory may hold a name twice
             * (tests/fuzz_c/duplicate-names-in-a-set.ffr), and its lookup finds one. */
            uint64_t found;
            struct stat looked;
            error = finished(t, tree_lookup_stat(t, entry + 1, (const uint8_t *) name, strlen(name), &looked));
            allowed(error, "tree_lookup_stat", entry);
            error = finished(t, tree_lookup(t, entry + 1, (const uint8_t *) name, strlen(name), &found));
            allowed(error, "tree_lookup", entry);
        }
    }
    uint8_t path[4096];
    size_t length;
    if (entry != 0 && path_of(t, entry, path, sizeof path, &length)) {
        uint64_t found;
        error = finished(t, tree_find(t, path, length, &found));
        allowed(error, "tree_find", entry);
        /* Two entries may not share a path (format section 5); where the index names
         * another, its own path must be this one. */
        uint8_t again[4096];
        size_t again_length;
        if (!error && found != entry && path_of(t, found, again, sizeof again, &again_length)
            && (again_length != length || memcmp(again, path, length) != 0))
            finding("tree_find places a path at an entry with another path", entry);
        if (S_ISREG(st.st_mode))
            read_whole(t, entry, path, length, data ? data + skip : NULL, got, read_error);
    }
    free(data);
    if (t->xattr_entries != 0) {
        uint8_t names[XATTR_LIST_LIMIT];
        XattrQuery q;
        memset(&q, 0, sizeof q);
        q.names = names;
        q.names_capacity = sizeof names;
        allowed(finished(t, tree_xattrs(t, entry + 1, &q)), "tree_xattrs", entry);
    }
}

/* A guard that never saw a truncation: the input's bytes are a buffer nothing truncates.
 * With it the library copies and decodes records from the map itself, as it does
 * under packfs._sigbus's guard, so the fuzzer reaches those paths too. */
static int never_changed(int slot)
{
    return 0;
}

static void fuzz_one(const uint8_t *data, size_t size, const Layout *layout, const Pages *pages, int check_once,
                     int fd)
{
    uint8_t *map = malloc(size ? size : 1);  /* exactly the archive: a read past it is reported */
    if (map == NULL)
        abort();
    memcpy(map, data, size);
    TreeSpans spans;
    memset(&spans, 0, sizeof spans);
    spans.base = map;
    spans.size = size;
    spans.fd = fd;
    /* "once" reads records in place, as packfs.core._format does; "never" with pread,
     * as the daemon does without a guard */
    spans.guard = check_once ? 0 : -1;
    spans.guard_check = check_once ? never_changed : NULL;
    spans.records = layout->records;
    spans.data_records = layout->data_records;
    spans.entries = layout->entries;
    memcpy(spans.sections, layout->table, sizeof spans.sections);
    spans.check_once = check_once;
    spans.name = "fuzz.ffr";
    spans.log_fd = -1;  /* the log is written nowhere: EBADF, ignored */
    spans.has_pieces = layout->has_pieces;
    memcpy(spans.pieces, layout->pieces, sizeof spans.pieces);
    spans.has_xattrs = layout->has_xattrs;
    memcpy(spans.xattrs, layout->xattrs, sizeof spans.xattrs);
    spans.has_codecs = layout->has_codecs;
    memcpy(spans.codecs, layout->codecs, sizeof spans.codecs);
    if (pages != NULL) {
        spans.has_pages = 1;
        spans.page_size = pages->page_size;
        spans.region_count = (unsigned) pages->region_count;
        memcpy(spans.regions, pages->regions, sizeof spans.regions);
        spans.page_crcs = (const uint8_t *) pages->crcs;
        spans.page_crc_bytes = pages->crc_bytes;
        spans.data_end = pages->data_end;
    }
    Tree tree;
    tree_prepare(&tree);
    int error = tree_open(&tree, &spans);
    if (error == 0) {
        if (pages != NULL && pages->hostile)
            finding("tree_open took a hostile page geometry", 0);
        for (uint64_t entry = 0; entry < tree.entries && entry < MAX_ENTRIES; entry++)
            read_entry(&tree, entry);
    } else if (error != EINVAL && error != ENOMEM) {
        finding("tree_open answered an errno other than EINVAL or ENOMEM", 0);
    }
    page_failure = 0;
    tree_close(&tree);
    free(map);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    Layout layout;
    memset(&layout, 0, sizeof layout);
    if (!layout_of(data, size, &layout))
        return 0;
    if (fd < 0 && (fd = memfd_create("packfs-format-fuzz", MFD_CLOEXEC)) < 0)
        abort();
    if (ftruncate(fd, (off_t) size) != 0)
        abort();
    for (size_t done = 0; done < size;) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t) done);
        if (n <= 0)
            abort();
        done += (size_t) n;
    }
    Pages pages;
    int paged = page_geometry(data, size, &layout, &pages);
    fuzz_one(data, size, &layout, paged ? &pages : NULL, 1, fd);  /* checksums "once" */
    fuzz_one(data, size, &layout, NULL, 0, fd);                   /* "never": nothing checked */
    if (paged)
        pages_free(&pages);
    return 0;
}
