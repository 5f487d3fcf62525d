/* The compiled daemon (packfs._lowlevel: the format library packfs/cformat/, the Python
 * glue packfs/cpython/ and the FUSE glue packfs/cdaemon/), built into a fuzzing or
 * stress program.
 *
 * Their sources are included whole and unchanged (one translation unit): the FUSE
 * callbacks are static, and this way the program runs exactly the code `packfs mount`
 * runs.  What libfuse would do around them is replaced here:
 *
 * - the request: fuse_req_userdata() and the fuse_reply_*() functions below take the
 *   place of libfuse's (a definition in the program wins over the shared library's),
 *   so each ll_*() callback runs as for a kernel request, and its reply is kept and
 *   checked as the kernel would take it (check_* below);
 * - the archive: a Tree is made by the Tree type's own constructor (tree_init, through
 *   an embedded CPython), from the archive's bytes in a heap buffer of exactly their
 *   size standing in for the map (serve(): AddressSanitizer reports a read past its
 *   end, or of any byte outside the header and the sections) and the same bytes in a
 *   memfd (which the daemon preads), with the section spans packfs.core computes at
 *   open (layout_of: format sections 1-3) and no SIGBUS guard (the memfd does not
 *   change unless a test truncates it, which tree_changed() then sees);
 * - format 1.4's page checks: the geometry and page CRCs Archive.page_checks would give
 *   (page_geometry), right for every page but those the input's page plan names, or
 *   hostile as it says.
 *
 * What counts as a finding (violation() aborts, saying what broke), besides a
 * sanitizer's report: a request answered twice or not at all; an errno a request
 * cannot get here; a reply the kernel would not take (a listing entry it cannot parse,
 * a name that is empty, over 1,024 bytes or holds '/' or NUL, an inode it was never
 * handed, a file type other than directory, file and symlink, an owner of (uid_t) -1);
 * a listing whose "." is not the directory or whose ".." is not the directory it was
 * listed in (format section 5: an entry is reached from one directory only); a read
 * that answers other bytes than its record's, or bytes outside the data area, or (once
 * checked) a record whose CRC does not match; a symlink target over 4,095 bytes; sizes
 * that disagree between the requests that give them; after the archive changed in
 * place, anything but EIO; with page checks, an answer other than the same request's
 * without them, unless EIO where a page's CRC is wrong (ASK), or a read through the map
 * of such a page (poisoned), or tree_init taking a hostile geometry.
 */

#ifndef PACKFS_FUZZ_DAEMON_H
#define PACKFS_FUZZ_DAEMON_H

/* memfd_create, as Python.h (pyconfig.h) would give it, which is no longer first. */
#define _GNU_SOURCE 1

#include "../packfs/cformat/table.c"
#include "../packfs/cformat/lookup.c"
#include "../packfs/cformat/records.c"
#include "../packfs/cformat/codecs.c"
#include "../packfs/cformat/forest.c"
#include "../packfs/cformat/blockcache.c"
#include "../packfs/cpython/tree_object.c"
#include "../packfs/cdaemon/fuse_ops.c"
#include "../packfs/cdaemon/_lowlevel_module.c"

#include <dirent.h>
#include <linux/fuse.h>
#include <sanitizer/asan_interface.h>  /* its poisoning macros do nothing in other builds */
#include <stdlib.h>

#ifndef PACKFS_FUZZ_PYTHON_HOME
#error "PACKFS_FUZZ_PYTHON_HOME: the Python whose libpython this is linked with (sys.base_prefix)"
#endif

/* -- the request and its reply ----------------------------------------------------- */

enum reply_kind {
    NO_REPLY, REPLY_ERR, REPLY_NONE, REPLY_ENTRY, REPLY_ATTR, REPLY_READLINK, REPLY_OPEN, REPLY_BUF,
    REPLY_STATFS, REPLY_XATTR
};

struct fuse_req {
    Tree *tree;
    Forest *forest;                /* a forest's request (walk_forest); else the tree's own */
    int replies;                   /* libfuse needs exactly one per request */
    int settled;                   /* the reply is whole: a READ parked on another thread's
                                      check is answered by that thread, later */
    enum reply_kind kind;
    int error;
    struct fuse_entry_param entry;
    struct stat attr;
    uint8_t *data;                 /* REPLY_BUF's bytes, REPLY_READLINK's target (malloc'ed) */
    size_t size;                   /* their length; REPLY_XATTR's count */
};

static void violation(const char *format, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void violation(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    fprintf(stderr, "packfs fuzz: ");
    vfprintf(stderr, format, args);
    fprintf(stderr, "\n");
    va_end(args);
    abort();
}

static void replied(fuse_req_t request, enum reply_kind kind)
{
    if (request->replies++)
        violation("a second reply to one request");
    request->kind = kind;
}

static void keep(fuse_req_t request, const void *bytes, size_t size)
{
    request->data = malloc(size ? size : 1);
    if (request->data == NULL)
        violation("out of memory");
    if (size)  /* (a reply of no bytes may come with no buffer) */
        memcpy(request->data, bytes, size);  /* every byte of the reply must be readable */
    request->size = size;
}

void *fuse_req_userdata(fuse_req_t request)
{
    return request->forest != NULL ? request->forest : request->tree->alone;  /* a Tree: a forest of one */
}

int fuse_reply_err(fuse_req_t request, int error)
{
    replied(request, REPLY_ERR);
    request->error = error;
    __atomic_store_n(&request->settled, 1, __ATOMIC_RELEASE);
    return 0;
}

void fuse_reply_none(fuse_req_t request)
{
    replied(request, REPLY_NONE);
    __atomic_store_n(&request->settled, 1, __ATOMIC_RELEASE);
}

int fuse_reply_entry(fuse_req_t request, const struct fuse_entry_param *entry)
{
    replied(request, REPLY_ENTRY);
    request->entry = *entry;
    __atomic_store_n(&request->settled, 1, __ATOMIC_RELEASE);
    return 0;
}

int fuse_reply_attr(fuse_req_t request, const struct stat *attr, double timeout)
{
    replied(request, REPLY_ATTR);
    request->attr = *attr;
    __atomic_store_n(&request->settled, 1, __ATOMIC_RELEASE);
    return 0;
}

int fuse_reply_readlink(fuse_req_t request, const char *target)
{
    replied(request, REPLY_READLINK);
    keep(request, target, strlen(target));
    __atomic_store_n(&request->settled, 1, __ATOMIC_RELEASE);
    return 0;
}

int fuse_reply_open(fuse_req_t request, const struct fuse_file_info *info)
{
    replied(request, REPLY_OPEN);
    __atomic_store_n(&request->settled, 1, __ATOMIC_RELEASE);
    return 0;
}

int fuse_reply_buf(fuse_req_t request, const char *bytes, size_t size)
{
    replied(request, REPLY_BUF);
    keep(request, bytes, size);
    __atomic_store_n(&request->settled, 1, __ATOMIC_RELEASE);
    return 0;
}

int fuse_reply_statfs(fuse_req_t request, const struct statvfs *st)
{
    replied(request, REPLY_STATFS);
    __atomic_store_n(&request->settled, 1, __ATOMIC_RELEASE);
    return 0;
}

int fuse_reply_xattr(fuse_req_t request, size_t count)
{
    replied(request, REPLY_XATTR);
    request->size = count;
    __atomic_store_n(&request->settled, 1, __ATOMIC_RELEASE);
    return 0;
}

static void begin(fuse_req_t request, Tree *t)
{
    memset(request, 0, sizeof *request);
    request->tree = t;
}

static void end(fuse_req_t request)
{
    free(request->data);
    request->data = NULL;
}

/* The errnos the daemon may answer an archive's request with (ENOMEM aside, which
 * these programs' small allocations never meet). */
static int errno_allowed(int error)
{
    return error == ENOENT || error == EIO || error == ENOTDIR || error == EISDIR || error == EINVAL
           || error == ENOSYS || error == ENODATA || error == ERANGE;
}

/* The request's reply is whole (a READ parked on another thread's check is answered
 * when that check ends). */
static void settle(fuse_req_t request, const char *what)
{
    for (int waited = 0; !__atomic_load_n(&request->settled, __ATOMIC_ACQUIRE); waited++) {
        if (waited > 300000)  /* 30 s: only a lost request waits that long */
            violation("%s: no reply after 30 s", what);
        usleep(100);
    }
}

/* The reply is ``kind``, or an allowed errno: 1 for the one, 0 for the other. */
static int answered(fuse_req_t request, enum reply_kind kind, const char *what)
{
    settle(request, what);
    if (request->replies != 1)
        violation("%s: %d replies, expected one", what, request->replies);
    if (request->kind == REPLY_ERR) {
        if (!errno_allowed(request->error))
            violation("%s: errno %d (%s)", what, request->error, strerror(request->error));
        return 0;
    }
    if (request->kind != kind)
        violation("%s: reply of kind %d, expected %d", what, request->kind, kind);
    return 1;
}

/* Attributes the kernel takes: an inode it was handed, a type it knows, an owner. */
static void check_attr(Tree *t, const struct stat *st, const char *what)
{
    unsigned type = st->st_mode & S_IFMT;
    if (st->st_ino < 1 || st->st_ino > t->entries)
        violation("%s: inode %llu outside 1..%llu", what, (unsigned long long) st->st_ino,
                  (unsigned long long) t->entries);
    if (type != S_IFDIR && type != S_IFREG && type != S_IFLNK)
        violation("%s: file type %o", what, type);
    if (st->st_uid == (uid_t) -1 || st->st_gid == (gid_t) -1)
        violation("%s: owner (uid_t) -1", what);
    if (st->st_size < 0 || st->st_mtim.tv_nsec < 0 || st->st_mtim.tv_nsec >= 1000000000)
        violation("%s: size %lld or nanoseconds %ld out of range", what, (long long) st->st_size,
                  (long) st->st_mtim.tv_nsec);
}

/* A name handed to the kernel: 1..1024 bytes, no '/' or NUL. */
static void check_name(const char *name, size_t length, const char *what)
{
    if (length < 1 || length > MAX_NAME || memchr(name, '/', length) || memchr(name, 0, length))
        violation("%s: a name of %zu bytes that is empty, too long, or holds '/' or NUL", what, length);
}

#include "layout.h"

/* -- the Tree ---------------------------------------------------------------------------- */

static int log_fd = -1;

/* Once per process: CPython (for tree_init's argument parsing; nothing else runs in
 * it), the Tree type, and where the daemon logs (/dev/null, or stderr with
 * PACKFS_FUZZ_LOG=1 to see what a case breaks). */
static void daemon_setup(void)
{
    PyPreConfig preconfig;
    PyPreConfig_InitIsolatedConfig(&preconfig);
    preconfig.allocator = PYMEM_ALLOCATOR_MALLOC;  /* the sanitizers see every allocation */
    if (PyStatus_Exception(Py_PreInitialize(&preconfig)))
        violation("cannot pre-initialise Python");
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.install_signal_handlers = 0;  /* the sanitizers' and libFuzzer's stay */
    config.site_import = 0;
    PyStatus status = PyConfig_SetBytesString(&config, &config.home, PACKFS_FUZZ_PYTHON_HOME);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status))
        violation("cannot initialise Python from %s: %s", PACKFS_FUZZ_PYTHON_HOME,
                  status.err_msg ? status.err_msg : "?");
    if (PyType_Ready(&TreeType) < 0 || PyType_Ready(&ForestType) < 0)
        violation("the Tree type is not ready");
    const char *logging = getenv("PACKFS_FUZZ_LOG");
    log_fd = logging && strcmp(logging, "1") == 0 ? 2 : open("/dev/null", O_WRONLY | O_CLOEXEC);
}

/* The memfd that holds the archive's bytes, which the daemon preads (through its own
 * duplicate): one per process, rewritten for each archive (the same size keeps its
 * pages, which a new memfd per case would allocate again); with no ``data``, the
 * memfd as it is. */
static int archive_fd(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0 && (fd = memfd_create("packfs-fuzz-archive", MFD_CLOEXEC)) < 0)
        violation("memfd_create: %s", strerror(errno));
    if (data == NULL)
        return fd;  /* as it is */
    if (ftruncate(fd, (off_t) size) != 0)
        violation("ftruncate of the memfd: %s", strerror(errno));
    for (size_t done = 0; done < size;) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t) done);
        if (n <= 0)
            violation("writing the memfd: %s", strerror(errno));
        done += (size_t) n;
    }
    return fd;
}

static PyObject *spans_tuple(unsigned long long (*span)[2], int count)
{
    PyObject *tuple = PyTuple_New(count);
    for (int k = 0; tuple != NULL && k < count; k++) {
        PyObject *item = Py_BuildValue("(KK)", span[k][0], span[k][1]);
        if (item == NULL) {
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, k, item);
    }
    return tuple;
}

/* The Python Tree object whose library Tree ``t`` is. */
static PyObject *tree_object(Tree *t)
{
    return (PyObject *) ((char *) t - offsetof(TreeObject, tree));
}

/* Set while a second Tree is made over the archive the memfd holds (serve). */
static int keep_archive_file;

/* A Tree being served, and the bytes it maps. */
typedef struct {
    Tree *tree;                    /* the Tree object's (tree_object) */
    uint8_t *map;
    size_t size;
} Served;

static void readable(uint8_t *map, size_t size, unsigned long long start, unsigned long long end)
{
    if (start <= end && end <= size)
        ASAN_UNPOISON_MEMORY_REGION(map + start, end - start);
}

/* The daemon's Tree over a copy of ``data``, made as packfs.fuse.inodedaemon.tree_for
 * makes it, with ``pages`` as Archive.page_checks (or none: NULL); 0 where tree_init
 * refuses the arguments (a ValueError: the daemon is never given them).  The copy
 * stands in for the archive's map: under AddressSanitizer only the header and the
 * spans the Tree is given are readable in it (the daemon reads
 * contents with pread, never through the map), so a read anywhere else in the archive
 * (the data area, a padding record, the footer) is reported, not just one past its end;
 * and so is a read of a page whose CRC is wrong (the daemon checks a page with pread,
 * and uses no value of one that failed), where no other region shares its bytes. */
static int serve(Served *served, const uint8_t *data, size_t size, const Layout *layout, int check_once,
                 const Pages *pages)
{
    served->size = size;
    served->map = malloc(size ? size : 1);
    if (served->map == NULL)
        violation("out of memory");
    memcpy(served->map, data, size);
    ASAN_POISON_MEMORY_REGION(served->map, size);
    readable(served->map, size, 0, 12 + 12 * layout->records);
    for (int k = 0; k < SECTIONS; k++)
        readable(served->map, size, layout->table[k][0], layout->table[k][1]);
    for (int k = 0; k < 3; k++) {
        if (layout->has_pieces)
            readable(served->map, size, layout->pieces[k][0], layout->pieces[k][1]);
        if (layout->has_xattrs)
            readable(served->map, size, layout->xattrs[k][0], layout->xattrs[k][1]);
        if (layout->has_codecs && k < 2)
            readable(served->map, size, layout->codecs[k][0], layout->codecs[k][1]);
    }
    if (pages != NULL && check_once && !pages->hostile && regions_apart(pages)) {
        for (int k = 0; k < pages->wrong_count; k++)
            ASAN_POISON_MEMORY_REGION(served->map + pages->wrong[k][0], pages->wrong[k][1] - pages->wrong[k][0]);
    }
    /* A second Tree over the same bytes (lowlevel_fuzz.c: serve_paged) finds them in the memfd: writing
     * them again would change its mtime, which the first Tree takes for a change. */
    int fd = archive_fd(keep_archive_file ? NULL : data, size);
    PyObject *page_checks = Py_None;
    Py_INCREF(Py_None);
    if (pages != NULL) {
        PyObject *regions = spans_tuple((unsigned long long (*)[2]) pages->regions, pages->region_count);
        Py_DECREF(Py_None);
        page_checks = regions == NULL ? NULL : Py_BuildValue("(KOy#K)", pages->page_size, regions,
                                                             (const char *) pages->crcs,
                                                             (Py_ssize_t) pages->crc_bytes, pages->data_end);
        Py_XDECREF(regions);
    }
    PyObject *mapping = PyMemoryView_FromMemory((char *) served->map, (Py_ssize_t) size, PyBUF_READ);
    PyObject *table = spans_tuple((unsigned long long (*)[2]) layout->table, SECTIONS);
    PyObject *pieces = layout->has_pieces ? spans_tuple((unsigned long long (*)[2]) layout->pieces, 3)
                                          : (Py_INCREF(Py_None), Py_None);
    PyObject *xattrs = layout->has_xattrs ? spans_tuple((unsigned long long (*)[2]) layout->xattrs, 3)
                                          : (Py_INCREF(Py_None), Py_None);
    PyObject *codecs = layout->has_codecs ? spans_tuple((unsigned long long (*)[2]) layout->codecs, 2)
                                          : (Py_INCREF(Py_None), Py_None);
    PyObject *tree = NULL;
    if (mapping != NULL && table != NULL && pieces != NULL && xattrs != NULL && page_checks != NULL
        && codecs != NULL) {
        PyObject *args = Py_BuildValue("(OiiKKKOisi)", mapping, fd, -1, (unsigned long long) layout->records,
                                       (unsigned long long) layout->data_records,
                                       (unsigned long long) layout->entries, table, check_once, "fuzz.ffr", log_fd);
        PyObject *kwargs = Py_BuildValue("{s:O,s:O,s:O,s:O}", "pieces", pieces, "xattrs", xattrs, "pages", page_checks,
                                         "codecs", codecs);
        if (args != NULL && kwargs != NULL)
            tree = PyObject_Call((PyObject *) &TreeType, args, kwargs);
        Py_XDECREF(args);
        Py_XDECREF(kwargs);
    }
    Py_XDECREF(mapping);
    Py_XDECREF(table);
    Py_XDECREF(pieces);
    Py_XDECREF(xattrs);
    Py_XDECREF(codecs);
    Py_XDECREF(page_checks);
    if (tree == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            violation("tree_init raised something other than ValueError");
        if (log_fd == 2)
            PyErr_Print();  /* PACKFS_FUZZ_LOG=1: why */
        PyErr_Clear();
    }
    served->tree = tree != NULL ? &((TreeObject *) tree)->tree : NULL;
    return tree != NULL;
}

static void unserve(Served *served)
{
    if (served->tree != NULL)
        Py_DECREF(tree_object(served->tree));
    ASAN_UNPOISON_MEMORY_REGION(served->map, served->size);
    free(served->map);
    memset(served, 0, sizeof *served);
}

/* -- the walk: every operation over what the listings reach, each reply checked ------- */

/* Work per walk (the daemon's each operation is bounded by the archive; these bound
 * how many a case makes), and below RELEASE_EVERY entries, so touched() never
 * madvises the heap buffer that stands in for the map. */
#define WALK_DIRECTORIES 48
#define WALK_CHILDREN 384
#define LISTING_PAGE 4096

typedef struct {
    char name[MAX_NAME + 1];
    size_t length;
    uint64_t inode;
    unsigned type;                 /* DT_* */
} Child;

typedef struct {
    const uint8_t *data;           /* the archive's bytes */
    size_t size;
    Tree *tree;
    unsigned variant;              /* the order children are visited in (threads differ) */
    int python;                    /* also through the Tree's Python methods (one thread only) */
    uint64_t operations;
    Tree *reference;               /* the same archive without page checks, asked each request
                                      too (ASK), or NULL */
    int damaged_pages;             /* pages of ``tree`` whose CRC is wrong */
    uint64_t inodes;               /* the inodes a listing may hand out (0: the tree's entries) */
} Walk;

static int same_attr(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_mode == b->st_mode && a->st_nlink == b->st_nlink && a->st_uid == b->st_uid
           && a->st_gid == b->st_gid && a->st_size == b->st_size && a->st_blocks == b->st_blocks
           && a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* With page checks, a request answers what it answers without them (``plain``), or EIO
 * where a page's CRC is wrong: a value on that page is never used. */
static void same_answer(Walk *w, fuse_req_t r, fuse_req_t plain, const char *what)
{
    settle(r, what);
    settle(plain, what);
    int same = r->replies == plain->replies && r->kind == plain->kind;
    if (same) {
        switch (r->kind) {
        case REPLY_ERR: same = r->error == plain->error; break;
        case REPLY_ENTRY:
            same = r->entry.ino == plain->entry.ino && same_attr(&r->entry.attr, &plain->entry.attr);
            break;
        case REPLY_ATTR: same = same_attr(&r->attr, &plain->attr); break;
        case REPLY_READLINK:
        case REPLY_BUF:
            same = r->size == plain->size && (r->size == 0 || memcmp(r->data, plain->data, r->size) == 0);
            break;
        case REPLY_XATTR: same = r->size == plain->size; break;
        default: break;
        }
    }
    if (!same && !(w->damaged_pages && r->kind == REPLY_ERR && r->error == EIO))
        violation("%s: with page checks (%d of them wrong) reply %d, errno %d, %zu bytes; without them reply %d, "
                  "errno %d, %zu bytes", what, w->damaged_pages, r->kind, r->error, r->size, plain->kind, plain->error,
                  plain->size);
}

/* Request ``callback`` (an ll_*() callback; its arguments after the request, evaluated
 * once per tree) of the walk's tree into ``r``, and of the reference tree if there is
 * one, whose answer it must agree with (same_answer). */
#define ASK(w, r, callback, ...)                                                                 \
    do {                                                                                         \
        begin((r), (w)->tree);                                                                   \
        callback((r), __VA_ARGS__);                                                              \
        if ((w)->reference != NULL) {                                                            \
            struct fuse_req plain_;                                                              \
            begin(&plain_, (w)->reference);                                                      \
            callback(&plain_, __VA_ARGS__);                                                      \
            same_answer((w), (r), &plain_, #callback);                                           \
            end(&plain_);                                                                        \
        }                                                                                        \
    } while (0)

/* Whether the archive was found changed in place (the stress program truncates it
 * under the walks): answers that must agree with earlier ones may be EIO from then on. */
static int changed(Walk *w)
{
    return __atomic_load_n(&w->tree->changed, __ATOMIC_RELAXED) != 0;
}

/* Entries of a READDIR(PLUS) reply of directory ``directory`` for ``offset``, checked
 * as the kernel parses them ("." is the directory itself); ".."'s inode goes to *up,
 * the children (positions 2 on) to ``children``.  Returns the next offset to ask for,
 * or 0 when the reply was empty. */
static uint64_t check_listing(Walk *w, fuse_req_t r, uint64_t directory, uint64_t offset, size_t size, int plus,
                              Child *children, size_t *count, size_t limit, uint64_t *up)
{
    if (r->size > size)
        violation("listing: %zu bytes in a reply of at most %zu", r->size, size);
    size_t at = 0;
    uint64_t position = offset;
    while (at < r->size) {
        size_t header = plus ? sizeof(struct fuse_entry_out) : 0;
        if (r->size - at < header + FUSE_NAME_OFFSET)
            violation("listing: a partial entry at byte %zu of %zu", at, r->size);
        const struct fuse_dirent *d = (const struct fuse_dirent *) (r->data + at + header);
        size_t length = plus ? FUSE_DIRENTPLUS_SIZE((const struct fuse_direntplus *) (r->data + at))
                             : FUSE_DIRENT_SIZE(d);
        if (length > r->size - at)
            violation("listing: an entry of %zu bytes past the reply's end", length);
        check_name(d->name, d->namelen, "listing");
        /* A child whose name is over NAME_MAX is left out, its position kept (format
         * section 5): the next offset may skip positions, never go back. */
        if (d->off <= position || (position < 2 && d->off != position + 1))
            violation("listing: next offset %llu after position %llu", (unsigned long long) d->off,
                      (unsigned long long) position);
        position = d->off - 1;
        int dot = (d->namelen == 1 && d->name[0] == '.') || (d->namelen == 2 && memcmp(d->name, "..", 2) == 0);
        if (position >= 2) {
            if (dot)
                violation("listing: a child named . or ..");
            if (d->ino < 1 || d->ino > (w->inodes ? w->inodes : w->tree->entries))
                violation("listing: inode %llu", (unsigned long long) d->ino);
            if (d->type != DT_DIR && d->type != DT_REG && d->type != DT_LNK)
                violation("listing: type %u", d->type);
            if (plus) {
                const struct fuse_entry_out *e = (const struct fuse_entry_out *) (r->data + at);
                /* nodeid 0: listed without attributes, whose rules they break (issue 23:
                 * the kernel makes no entry, and a LOOKUP of it answers EIO). */
                if (e->nodeid != 0 && (e->nodeid != d->ino || e->attr.ino != d->ino))
                    violation("listing: an entry's inode %llu is not its attributes' %llu",
                              (unsigned long long) d->ino, (unsigned long long) e->attr.ino);
            }
            if (*count < limit) {
                Child *c = &children[(*count)++];
                memcpy(c->name, d->name, d->namelen);
                c->name[d->namelen] = 0;
                c->length = d->namelen;
                c->inode = d->ino;
                c->type = d->type;
            }
        } else if (!dot || d->namelen != position + 1) {
            violation("listing: position %llu is not %s", (unsigned long long) position, position ? ".." : ".");
        } else if (position == 0 && d->ino != directory) {
            violation("listing: . of inode %llu is inode %llu", (unsigned long long) directory,
                      (unsigned long long) d->ino);
        } else if (position == 1) {
            *up = d->ino;
        }
        at += length;
        position++;
    }
    return r->size ? position : 0;
}

/* A file's record (entry ``inode`` - 1's, as tree_read finds it; called after a read
 * succeeded): its bytes in the archive and its CRC.  It must be a data record inside
 * the data area (format section 5: no file's contents include table or footer bytes). */
/* The walk's own look at the table and the header: in the archive's bytes, not through
 * the Tree (whose page checks would count it as the operation's, and whose map is
 * poisoned where a page's CRC is wrong). */
static const uint8_t *table_at(Walk *w, int k, uint64_t index)
{
    return w->data + (w->tree->column[k] - w->tree->base) + (uint64_t) item_size[k] * index;
}

static uint64_t header_offset(Walk *w, uint64_t record)
{
    return u64_at(w->data + 12 + 4 * w->tree->records + 8 * record);
}

static const uint8_t *record_bytes(Walk *w, uint64_t inode, uint64_t *length, uint32_t *crc)
{
    Tree *t = w->tree;
    uint64_t record = u64_at(table_at(w, RECORD, inode - 1));
    if (record >= t->data_records)
        violation("inode %llu answered from record %llu, not a data record", (unsigned long long) inode,
                  (unsigned long long) record);
    uint64_t start = header_offset(w, record), end = header_offset(w, record + 1);
    if (start < t->header_end || start > end || end > t->data_end)
        violation("inode %llu answered from bytes [%llu, %llu), outside the data area [%llu, %llu)",
                  (unsigned long long) inode, (unsigned long long) start, (unsigned long long) end,
                  (unsigned long long) t->header_end, (unsigned long long) t->data_end);
    *length = end - start;
    *crc = u32_at(w->data + 12 + 4 * record);
    return w->data + start;
}

/* -- format 1.5's codecs, decoded here on their own (section 4f) --------------------------- */

/* The codec row of the record inode ``inode`` names, from the archive's bytes: its
 * codec (CODEC_STORED without codecs, or with a row outside the section: the daemon
 * refuses that before reading). */
static const uint8_t *codec_row_at(Walk *w, uint64_t record)
{
    Tree *t = w->tree;
    if (t->record_codec == NULL || record >= t->data_records)
        return NULL;
    return w->data + (t->record_codec - t->base) + CODEC_ROW * record;
}

/* The largest zstd file or frame the reference decodes (format section 4f: 1 MiB). */
#define REFERENCE_FRAME_MAX ((uint64_t) 1 << 20)

/* What a decoded read of bytes [offset, offset + count) must answer: *expected
 * (malloc'ed, ``count`` bytes) and, for each byte, whether the reference could decode it
 * (*known: 1; 0 where a frame or extent is broken, which a read covering it must answer
 * with EIO).  The work is bounded by the read, not the file: one zstd file (at most
 * 1 MiB), the frames the read covers, the extents up to its end. */
static void reference_contents(Walk *w, const uint8_t *row, const uint8_t *stored, uint64_t length,
                               uint64_t file_size, uint64_t offset, uint64_t count, uint8_t **expected,
                               uint8_t **known)
{
    Tree *t = w->tree;
    uint8_t *out = calloc(count ? count : 1, 1), *ok = calloc(count ? count : 1, 1);
    if (out == NULL || ok == NULL)
        violation("out of memory");
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    uint64_t aux = u64_at(row + 8), until = offset + count;
    const uint8_t *section = w->data + (t->codec_data - t->base);
    if (row[0] == CODEC_ZSTD && file_size <= REFERENCE_FRAME_MAX) {
        const uint8_t *dictionary = NULL;
        uint64_t dictionary_length = 0;
        if (aux != NO_RECORD && aux < t->data_records) {
            uint64_t from = header_offset(w, aux), to = header_offset(w, aux + 1);
            if (from <= to && to <= w->size) {
                dictionary = w->data + from;
                dictionary_length = to - from;
            }
        }
        uint8_t *whole = malloc(file_size ? file_size : 1);
        if (whole == NULL)
            violation("out of memory");
        size_t got = ZSTD_decompress_usingDict(dctx, whole, (size_t) file_size, stored, (size_t) length, dictionary,
                                               (size_t) dictionary_length);
        int sound = !ZSTD_isError(got) && got == file_size
                    && (!t->check_once || (uint32_t) crc32(crc32(0L, Z_NULL, 0), whole, (uInt) file_size) == u32_at(row + 4));
        memcpy(out, whole + offset, (size_t) count);
        memset(ok, sound, (size_t) count);
        free(whole);
    } else if (row[0] == CODEC_FRAMES && row[1] >= FRAME_LOG2_MIN && row[1] <= FRAME_LOG2_MAX && count) {
        uint64_t frame = (uint64_t) 1 << row[1];
        uint8_t *decoded = malloc(frame);
        if (decoded == NULL)
            violation("out of memory");
        for (uint64_t k = offset / frame; k <= (until - 1) / frame && aux + FRAME_ROW * (k + 1) <= t->codec_data_size;
             k++) {
            const uint8_t *entry = section + aux + FRAME_ROW * k;
            uint64_t from = k ? u64_at(entry - FRAME_ROW) : 0, to = u64_at(entry);
            uint64_t at = k * frame, expected_size = file_size - at < frame ? file_size - at : frame;
            if (from >= to || to > length)
                continue;
            if (t->check_once && (uint32_t) crc32(crc32(0L, Z_NULL, 0), stored + from, (uInt) (to - from)) != u32_at(entry + 8))
                continue;
            size_t got = ZSTD_decompressDCtx(dctx, decoded, (size_t) expected_size, stored + from, (size_t) (to - from));
            if (ZSTD_isError(got) || got != expected_size)
                continue;
            if (t->check_once && (uint32_t) crc32(crc32(0L, Z_NULL, 0), decoded, (uInt) expected_size) != u32_at(entry + 12))
                continue;
            uint64_t a = at > offset ? at : offset, b = at + expected_size < until ? at + expected_size : until;
            memcpy(out + (a - offset), decoded + (a - at), (size_t) (b - a));
            memset(ok + (a - offset), 1, (size_t) (b - a));
        }
        free(decoded);
    } else if (row[0] == CODEC_SPARSE && aux <= t->codec_data_size && t->codec_data_size - aux >= 8) {
        uint64_t extents = u64_at(section + aux), used = 0, previous_end = 0;
        uint64_t room = (t->codec_data_size - aux - 8) / EXTENT_ROW;
        memset(ok, extents <= room, (size_t) count);  /* holes read as zeros until an extent breaks */
        for (uint64_t j = 0; j < extents && j < room; j++) {
            uint64_t o = u64_at(section + aux + 8 + EXTENT_ROW * j), l = u64_at(section + aux + 16 + EXTENT_ROW * j);
            if (l == 0 || o < previous_end || o > file_size || l > file_size - o || l > length - used) {
                /* the daemon's walk meets this extent in a read that reaches the previous one's start */
                uint64_t reached = j ? u64_at(section + aux + 8 + EXTENT_ROW * (j - 1)) : 0;
                if (reached < until)
                    memset(ok + (reached > offset ? reached - offset : 0), 0,
                           (size_t) (until - (reached > offset ? reached : offset)));
                break;
            }
            if (o >= until)
                break;
            uint64_t a = o > offset ? o : offset, b = o + l < until ? o + l : until;
            if (a < b)
                memcpy(out + (a - offset), stored + used + (a - o), (size_t) (b - a));
            previous_end = o + l;
            used += l;
        }
    }
    ZSTD_freeDCtx(dctx);
    *expected = out;
    *known = ok;
}

/* READ of ``size`` bytes at ``offset``: the reply is the record's bytes there, and,
 * checked once, bytes whose CRC matched (a record without pieces: its whole CRC); a
 * record that is not stored as it is (format 1.5), its contents decoded here. */
static void walk_read(Walk *w, uint64_t inode, off_t offset, size_t size)
{
    struct fuse_req r;
    ASK(w, &r, ll_read, inode, size, offset, &(struct fuse_file_info){0});
    w->operations++;
    if (answered(&r, REPLY_BUF, "read")) {
        uint64_t length;
        uint32_t crc;
        const uint8_t *bytes = record_bytes(w, inode, &length, &crc);
        const uint8_t *row = codec_row_at(w, u64_at(table_at(w, RECORD, inode - 1)));
        if (row != NULL && row[0] != CODEC_STORED) {
            uint64_t file_size = u64_at(table_at(w, SIZE, inode - 1));
            uint64_t expected = (uint64_t) offset >= file_size ? 0 : file_size - (uint64_t) offset < size
                                                                 ? file_size - (uint64_t) offset : size;
            if (r.size != expected)
                violation("read %zu at %lld of a %llu-byte file (codec %u): %zu bytes", size, (long long) offset,
                          (unsigned long long) file_size, row[0], r.size);
            /* (a frame's bytes have CRCs of their own; a sparse file's hole reads no stored byte) */
            if (w->tree->check_once && row[0] == CODEC_ZSTD && length <= PIECE_SIZE && r.size
                && (uint32_t) crc32(crc32(0L, Z_NULL, 0), bytes, (uInt) length) != crc)
                violation("read at %lld: a checked read of a record (codec %u) whose CRC does not match",
                          (long long) offset, row[0]);
            if (r.size) {
                uint8_t *contents, *known;
                reference_contents(w, row, bytes, length, file_size, (uint64_t) offset, r.size, &contents, &known);
                for (size_t k = 0; k < r.size; k++) {
                    if (!known[k])
                        violation("read %zu at %lld (codec %u): byte %zu answered where its frame or extent is "
                                  "broken", size, (long long) offset, row[0], k);
                    if (r.data[k] != contents[k])
                        violation("read %zu at %lld (codec %u): byte %zu is not the file's", size, (long long) offset,
                                  row[0], k);
                }
                free(contents);
                free(known);
            }
            end(&r);
            return;
        }
        uint64_t expected = (uint64_t) offset >= length ? 0 : length - (uint64_t) offset < size
                                                              ? length - (uint64_t) offset : size;
        if (r.size != expected)
            violation("read %zu at %lld of a %llu-byte file: %zu bytes", size, (long long) offset,
                      (unsigned long long) length, r.size);
        if (r.size && memcmp(r.data, bytes + offset, r.size) != 0)
            violation("read %zu at %lld: bytes other than the record's", size, (long long) offset);
        if (w->tree->check_once && length <= PIECE_SIZE && r.size
            && (uint32_t) crc32(crc32(0L, Z_NULL, 0), bytes, (uInt) length) != crc)
            violation("read at %lld: a checked read of a record whose CRC does not match", (long long) offset);
    }
    end(&r);
}

static void walk_readlink(Walk *w, uint64_t inode)
{
    struct fuse_req r;
    ASK(w, &r, ll_readlink, inode);
    w->operations++;
    if (answered(&r, REPLY_READLINK, "readlink")) {
        uint64_t length;
        uint32_t crc;
        const uint8_t *bytes = record_bytes(w, inode, &length, &crc);
        if (r.size < 1 || r.size > MAX_SYMLINK_TARGET || r.size != length || memcmp(r.data, bytes, length) != 0)
            violation("readlink: a target of %zu bytes that is not its record's %llu", r.size,
                      (unsigned long long) length);
        if (w->tree->check_once && (uint32_t) crc32(crc32(0L, Z_NULL, 0), bytes, (uInt) length) != crc)
            violation("readlink: a checked target whose CRC does not match");
    }
    end(&r);
}

static void walk_getattr(Walk *w, uint64_t inode)
{
    struct fuse_req r;
    ASK(w, &r, ll_getattr, inode, NULL);
    w->operations++;
    if (answered(&r, REPLY_ATTR, "getattr"))
        check_attr(w->tree, &r.attr, "getattr");
    end(&r);
}

static void walk_lookup(Walk *w, uint64_t parent, const char *name)
{
    struct fuse_req r;
    ASK(w, &r, ll_lookup, parent, name);
    w->operations++;
    if (answered(&r, REPLY_ENTRY, "lookup") && r.entry.ino != 0) {  /* 0: a negative entry */
        check_attr(w->tree, &r.entry.attr, "lookup");
        if (r.entry.ino != r.entry.attr.st_ino)
            violation("lookup: inode %llu with attributes of %llu", (unsigned long long) r.entry.ino,
                      (unsigned long long) r.entry.attr.st_ino);
    }
    end(&r);
}

/* LISTXATTR with the size the kernel asks first (0), then with room for the answer
 * and with one byte less; GETXATTR of each name it lists (a few) and of one not there. */
static void walk_xattrs(Walk *w, uint64_t inode)
{
    struct fuse_req r;
    ASK(w, &r, ll_listxattr, inode, 0);
    w->operations++;
    int listed = answered(&r, REPLY_XATTR, "listxattr");
    size_t count = listed ? r.size : 0;
    end(&r);
    if (!listed)
        return;
    if (count > XATTR_LIST_LIMIT)
        violation("listxattr: %zu bytes of names", count);
    if (count > 0) {
        ASK(w, &r, ll_listxattr, inode, count - 1);
        w->operations++;
        if (answered(&r, REPLY_BUF, "listxattr") || (r.error != ERANGE && !changed(w)))
            violation("listxattr: room for %zu of %zu bytes did not answer ERANGE", count - 1, count);
        end(&r);
    }
    ASK(w, &r, ll_listxattr, inode, count ? count : 1);
    w->operations++;
    if (answered(&r, REPLY_BUF, "listxattr")) {
        if (r.size != count && !changed(w))
            violation("listxattr: %zu bytes of names, %zu before", r.size, count);
        if (count && r.data[count - 1] != 0)
            violation("listxattr: the names do not end in NUL");
        size_t asked = 0;
        for (size_t at = 0; at < r.size && asked < 4; asked++) {
            const char *name = (const char *) r.data + at;
            size_t length = strlen(name);
            if (length == 0)
                violation("listxattr: an empty name");
            size_t value = 0;
            static const size_t rooms[] = {0, XATTR_VALUE_LIMIT, 1};  /* the size, the value, ERANGE */
            for (size_t k = 0; k < 3; k++) {
                struct fuse_req g;
                ASK(w, &g, ll_getxattr, inode, name, rooms[k]);
                w->operations++;
                if (answered(&g, rooms[k] ? REPLY_BUF : REPLY_XATTR, "getxattr")) {
                    if (g.size > XATTR_VALUE_LIMIT || (k > 0 && g.size != value && !changed(w)))
                        violation("getxattr: a value of %zu bytes (%zu before)", g.size, value);
                    value = g.size;
                } else if (k == 2 && value > 1 && g.error != ERANGE && !changed(w)) {
                    violation("getxattr: room for 1 of %zu bytes did not answer ERANGE", value);
                }
                end(&g);
            }
            at += length + 1;
        }
    }
    end(&r);
    ASK(w, &r, ll_getxattr, inode, "user.packfs-fuzz-missing", 0);
    w->operations++;
    if (answered(&r, REPLY_XATTR, "getxattr"))
        violation("getxattr: a name no archive has was found");
    end(&r);
}

/* Everything asked of one child: LOOKUP by name, GETATTR, and by type READ (at the
 * start, at 1, past the first piece, at the end), READLINK, or nothing more; OPEN,
 * the attributes. */
static void walk_child(Walk *w, uint64_t parent, const Child *c)
{
    walk_lookup(w, parent, c->name);
    walk_getattr(w, c->inode);
    if (c->type == DT_REG) {
        walk_read(w, c->inode, 0, MAX_REQUEST);
        walk_read(w, c->inode, 1, 4096);
        walk_read(w, c->inode, (off_t) PIECE_SIZE + 5, 4096);
        struct fuse_req r;
        ASK(w, &r, ll_getattr, c->inode, NULL);
        off_t size = r.kind == REPLY_ATTR ? r.attr.st_size : 0;
        end(&r);
        if (size > 1)
            walk_read(w, c->inode, size - 1, 2);
        if (size > 2)  /* across the middle: a frame boundary of a large compressed file, an extent's edge */
            walk_read(w, c->inode, size / 2 - 1, 70000);
    } else if (c->type == DT_LNK) {
        walk_readlink(w, c->inode);
    }
    struct fuse_req r;
    ASK(w, &r, ll_open, c->inode, &(struct fuse_file_info){0});
    w->operations++;
    answered(&r, REPLY_OPEN, "open");
    end(&r);
    walk_xattrs(w, c->inode);
}

/* One directory's listing, page by page (READDIRPLUS, as the kernel asks first), into
 * ``children``; then the same from position 1 with plain READDIR in pages too small
 * for more than an entry or two (the kernel asks again from where a page ended). */
static size_t walk_listing(Walk *w, uint64_t inode, Child *children, size_t limit, uint64_t *up)
{
    size_t count = 0;
    *up = 0;
    uint64_t offset = 0;
    for (int page = 0; page < 64; page++) {
        struct fuse_req r;
        ASK(w, &r, ll_readdirplus, inode, LISTING_PAGE, (off_t) offset, &(struct fuse_file_info){0});
        w->operations++;
        uint64_t next = answered(&r, REPLY_BUF, "readdirplus")
                            ? check_listing(w, &r, inode, offset, LISTING_PAGE, 1, children, &count, limit, up)
                            : 0;
        end(&r);
        if (next == 0 || count >= limit)
            break;
        offset = next;
    }
    size_t ignored = 0;
    offset = 1;
    for (int page = 0; page < 8; page++) {
        struct fuse_req r;
        size_t small = 48 + (w->variant + (unsigned) page) % 64;
        ASK(w, &r, ll_readdir, inode, small, (off_t) offset, &(struct fuse_file_info){0});
        w->operations++;
        uint64_t next = answered(&r, REPLY_BUF, "readdir")
                            ? check_listing(w, &r, inode, offset, small, 0, NULL, &ignored, 0, up) : 0;
        end(&r);
        if (next == 0)
            break;
        offset = next;
    }
    return count;
}

/* What no listing reaches: inodes out of range, the wrong type, odd names. */
static void walk_strays(Walk *w)
{
    uint64_t last = w->tree->entries;
    uint64_t inodes[] = {0, last + 1, UINT64_MAX};
    for (size_t k = 0; k < sizeof inodes / sizeof *inodes; k++) {
        struct fuse_req r;
        ASK(w, &r, ll_getattr, inodes[k], NULL);
        if (answered(&r, REPLY_ATTR, "getattr of a stray inode"))
            violation("getattr of inode %llu answered", (unsigned long long) inodes[k]);
        end(&r);
        walk_read(w, inodes[k], 0, 16);
        walk_readlink(w, inodes[k]);
        walk_xattrs(w, inodes[k]);
        walk_lookup(w, inodes[k], "x");
    }
    /* Inodes the kernel may not have been handed (a listing stopped at a broken entry):
     * every operation on the first few, and LOOKUP of the names the table holds, taken
     * from it unchecked (a name the kernel can send: 1..1024 bytes, no '/' or NUL), in
     * their parent and in the root. */
    Tree *t = w->tree;
    for (uint64_t inode = 2; inode <= last && inode <= 24; inode++) {
        Child unlisted[8];
        uint64_t up;
        walk_listing(w, inode, unlisted, 8, &up);
        walk_getattr(w, inode);
        walk_read(w, inode, 0, 4096);
        walk_readlink(w, inode);
        walk_xattrs(w, inode);
    }
    const uint8_t *table_names = table_at(w, NAMES, 0);
    for (uint64_t entry = 1; entry < last && entry <= 64; entry++) {
        uint64_t start = u64_at(table_at(w, NAME_END, entry - 1)), end = u64_at(table_at(w, NAME_END, entry));
        if (start >= end || end > t->names_size || end - start > MAX_NAME || memchr(table_names + start, 0, end - start)
            || memchr(table_names + start, '/', end - start))
            continue;
        char name[MAX_NAME + 1];
        memcpy(name, table_names + start, end - start);
        name[end - start] = 0;
        walk_lookup(w, (uint64_t) u32_at(table_at(w, PARENT, entry)) + 1, name);
        walk_lookup(w, 1, name);
    }
    walk_read(w, 1, 0, 16);  /* the root: EISDIR */
    walk_read(w, 1, -1, 16);
    walk_readlink(w, 1);
    const char *names[] = {"", ".", "..", "missing", "\xff\xfe", "a/b"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        walk_lookup(w, 1, names[k]);
    struct fuse_req r;
    ASK(w, &r, ll_statfs, 1);
    answered(&r, REPLY_STATFS, "statfs");
    end(&r);
    ASK(w, &r, ll_opendir, 1, &(struct fuse_file_info){0});
    answered(&r, REPLY_OPEN, "opendir");
    end(&r);
    ASK(w, &r, ll_forget, 1, 1);
    if (r.kind != REPLY_NONE)
        violation("forget answered");
    end(&r);
}

/* The same operations through the Tree's Python methods (what tests/fuzz.py and the
 * tests call; one thread, which holds the GIL): each returns a value of its type or
 * raises OSError with an errno a request may get. */
static void python_call(Walk *w, const char *method, const char *format, ...)
{
    va_list arguments;
    va_start(arguments, format);
    PyObject *args = Py_VaBuildValue(format, arguments);
    va_end(arguments);
    PyObject *function = PyObject_GetAttrString(tree_object(w->tree), method);
    PyObject *result = args != NULL && function != NULL ? PyObject_Call(function, args, NULL) : NULL;
    Py_XDECREF(args);
    Py_XDECREF(function);
    w->operations++;
    if (result == NULL) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        int error = -1;
        if (value != NULL && PyErr_GivenExceptionMatches(type, PyExc_OSError)) {
            PyObject *number = PyObject_GetAttrString(value, "errno");
            error = number != NULL && PyLong_Check(number) ? (int) PyLong_AsLong(number) : -1;
            Py_XDECREF(number);
        }
        if (!errno_allowed(error)) {
            PyErr_Restore(type, value, traceback);
            PyErr_Print();
            violation("Tree.%s raised something other than OSError with an allowed errno", method);
        }
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        PyErr_Clear();
        return;
    }
    int expected = strcmp(method, "lookup") == 0 || strcmp(method, "getattr") == 0 ? PyDict_Check(result)
                   : strcmp(method, "readdir") == 0 ? PyList_Check(result) : PyBytes_Check(result);
    Py_DECREF(result);
    if (!expected)
        violation("Tree.%s returned a value of another type", method);
}

static void python_child(Walk *w, uint64_t parent, const Child *c)
{
    python_call(w, "lookup", "(Ky#)", (unsigned long long) parent, c->name, (Py_ssize_t) c->length);
    unsigned long long inode = c->inode;
    python_call(w, "getattr", "(K)", inode);
    python_call(w, "read", "(KKn)", inode, 0ull, (Py_ssize_t) 4096);
    python_call(w, "read", "(KKn)", inode, (unsigned long long) PIECE_SIZE + 5, (Py_ssize_t) 16);
    python_call(w, "readlink", "(K)", inode);
    python_call(w, "listxattr", "(K)", inode);
    python_call(w, "getxattr", "(Ky)", inode, "user.greeting");
    python_call(w, "readdir", "(K)", inode);
    python_call(w, "readdir", "(KK)", inode, 2ull);
}

/* The in-process read path (Tree.read_file) for the stored paths of the first entries,
 * built from the table unchecked (parents before their children, at most 4 KiB): it
 * returns bytes or raises OSError with an errno a READ may get, and what it returns is
 * what READs of that entry answer. */
static void python_read_files(Walk *w)
{
    Tree *t = w->tree;
    const uint8_t *table_names = table_at(w, NAMES, 0);
    for (uint64_t entry = 1; entry < t->entries && entry <= 32; entry++) {
        char path[4096];
        size_t length = 0;
        int ok = 1;
        for (uint64_t at = entry, depth = 0; at != 0 && ok; depth++) {
            uint64_t start = at ? u64_at(table_at(w, NAME_END, at - 1)) : 0, end = u64_at(table_at(w, NAME_END, at));
            uint64_t parent = u32_at(table_at(w, PARENT, at));
            ok = depth < 64 && start <= end && end <= t->names_size && end - start + 1 + length <= sizeof path
                 && parent < at;
            if (ok) {  /* prepend the name, and a '/' unless it is the first */
                size_t name = (size_t) (end - start), slash = length ? 1 : 0;
                memmove(path + name + slash, path, length);
                memcpy(path, table_names + start, name);
                if (slash)
                    path[name] = '/';
                length += name + slash;
                at = parent;
            }
        }
        if (!ok)
            continue;
        /* the entry read_file finds (a hostile table may hold the path twice) */
        uint64_t found = entry;
        int missing = tree_find(t, (const uint8_t *) path, length, &found);
        finished(t, 0);  /* this thread's page failures are the next operation's otherwise */
        /* at most 4 MiB: a hostile sparse or framed file may claim any size (read_file allocates it) */
        PyObject *result = PyObject_CallMethod(tree_object(t), "read_file", "(y#L)", path, (Py_ssize_t) length,
                                               (long long) 4 << 20);
        w->operations++;
        if (result == NULL) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            PyObject *number = value != NULL && PyErr_GivenExceptionMatches(type, PyExc_OSError)
                               ? PyObject_GetAttrString(value, "errno") : NULL;
            int error = number != NULL && PyLong_Check(number) ? (int) PyLong_AsLong(number) : -1;
            Py_XDECREF(number);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            PyErr_Clear();
            if (!errno_allowed(error) && error != EFBIG)  /* EFBIG: over the 4 MiB asked for */
                violation("Tree.read_file raised something other than OSError with an allowed errno");
            continue;
        }
        if (!PyBytes_Check(result))
            violation("Tree.read_file returned a value of another type");
        if (missing)
            violation("Tree.read_file returned the contents of a path it does not find");
        Py_ssize_t size = PyBytes_GET_SIZE(result);
        size_t ask = size < (Py_ssize_t) MAX_REQUEST ? (size_t) size + 1 : MAX_REQUEST;
        struct fuse_req r;
        begin(&r, t);
        ll_read(&r, found + 1, ask, 0, &(struct fuse_file_info){0});
        if (answered(&r, REPLY_BUF, "read after read_file") && !changed(w)
            && (r.size != (size_t) (size < (Py_ssize_t) ask ? size : (Py_ssize_t) ask)
                || memcmp(r.data, PyBytes_AS_STRING(result), r.size) != 0))
            violation("Tree.read_file of entry %llu: %zd bytes that a READ of it does not answer",
                      (unsigned long long) found, size);
        end(&r);
        Py_DECREF(result);
    }
}

/* The walk from the root: each directory's listing, then everything of each child;
 * ``variant`` rotates the order of the children so threads meet in different places. */
static void walk_tree(Walk *w)
{
    struct fuse_conn_info conn;
    memset(&conn, 0, sizeof conn);
    conn.capable = ~0u;
    ll_init(w->tree->alone, &conn);
    if (w->reference != NULL)
        ll_init(w->reference->alone, &conn);
    Child *children = malloc(WALK_CHILDREN * sizeof *children);
    uint64_t directories[WALK_DIRECTORIES], parents[WALK_DIRECTORIES];
    size_t pending = 0, visited = 0, budget = WALK_CHILDREN;
    if (children == NULL)
        violation("out of memory");
    directories[pending] = parents[pending] = 1;  /* the root's .. is itself */
    pending++;
    while (pending && visited < WALK_DIRECTORIES && budget) {
        pending--;
        uint64_t inode = directories[pending], parent = parents[pending], up;
        visited++;
        size_t count = walk_listing(w, inode, children, budget, &up);
        /* A directory is listed in one directory, its parent (no entry is reached by
         * two paths: format section 5), and its .. says so. */
        if (up != 0 && up != parent)
            violation("listing: .. of inode %llu, listed in inode %llu, is inode %llu", (unsigned long long) inode,
                      (unsigned long long) parent, (unsigned long long) up);
        budget -= count;
        for (size_t k = 0; k < count; k++) {
            const Child *c = &children[(k + w->variant) % count];
            walk_child(w, inode, c);
            if (w->python && k < 16)
                python_child(w, inode, c);
            if (c->type == DT_DIR && pending < WALK_DIRECTORIES) {
                directories[pending] = c->inode;
                parents[pending++] = inode;
            }
        }
    }
    free(children);
    walk_strays(w);
    if (w->python) {
        python_call(w, "readdir", "(K)", 1ull);
        python_call(w, "read", "(KKn)", 1ull, 0ull, (Py_ssize_t) -1);  /* EINVAL */
        python_call(w, "getattr", "(K)", (unsigned long long) w->tree->entries + 1);
        python_read_files(w);
    }
}

/* A request of forest ``f`` (its trees' first is ``t``): one reply, an errno it may get. */
#define ASK_FOREST(r, f, t, callback, ...)                                                       \
    do {                                                                                         \
        begin((r), (t));                                                                         \
        (r)->forest = (f);                                                                       \
        callback((r), __VA_ARGS__);                                                              \
        w->operations++;                                                                         \
        settle((r), #callback);                                                                  \
        if ((r)->replies != 1 || ((r)->kind == REPLY_ERR && !errno_allowed((r)->error)))          \
            violation("forest %s: %d replies, errno %d", #callback, (r)->replies, (r)->error);  \
    } while (0)

/* Two trees of the same archive as one set whose root both hold (a forest of two: the
 * root's listing is the first's children then the second's, a name repeated at the seam
 * listed once), or NULL where Forest() refuses them (ValueError). */
static PyObject *forest_of_two(Tree *first, Tree *second)
{
    PyObject *forest = PyObject_CallFunction((PyObject *) &ForestType, "([OO][(KK[(II)(II)])])", tree_object(first),
                                             tree_object(second), 0ULL, 3ULL, 0u, 0u, 1u, 0u);
    if (forest == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            violation("Forest() raised something other than ValueError");
        PyErr_Clear();
    }
    return forest;
}

/* Forest ``f`` (whose first tree is w->tree) walked through the FUSE callbacks: each
 * listing checked as the kernel parses it, each child's LOOKUP answering the inode its
 * listing gave (but in the root, whose parts hold the same names), and its GETATTR,
 * READ, READLINK and LISTXATTR one reply each, an errno it may get.  ``variant``
 * rotates the order children are visited in (threads differ). */
static void walk_forest(Walk *w, Forest *f, unsigned variant)
{
    Tree *first = w->tree;
    w->inodes = f->bases[f->count];
    Child *children = malloc(WALK_CHILDREN * sizeof *children);
    uint64_t directories[WALK_DIRECTORIES] = {1};
    size_t pending = 1, visited = 0, budget = WALK_CHILDREN;
    struct fuse_req r;
    while (visited < pending && budget > 0) {
        uint64_t directory = directories[visited++], up = 0, offset = 0;
        for (int plus = 0; plus <= 1; plus++) {
            size_t count = 0;
            offset = 0;
            for (int pages = 0; pages < 64; pages++) {
                ASK_FOREST(&r, f, first, (plus ? ll_readdirplus : ll_readdir), directory, LISTING_PAGE / 8,
                           (off_t) offset, &(struct fuse_file_info){0});
                uint64_t next = r.kind == REPLY_BUF ? check_listing(w, &r, directory, offset, LISTING_PAGE / 8, plus,
                                                                    children, &count, budget, &up)
                                                    : 0;
                end(&r);
                if (next == 0)
                    break;
                offset = next;
            }
            if (plus)
                break;
            for (size_t j = 0; j < count; j++) {
                Child *c = &children[(j + variant) % count];
                ASK_FOREST(&r, f, first, ll_lookup, directory, c->name);
                /* (The root's two parts hold the same names: a lookup there finds the second's.  A
                 * hostile child range may hold a name twice, which only verify refuses (format
                 * section 5): a lookup then finds one of them.) */
                int listed_as = 0;
                for (size_t other = 0; other < count && !listed_as; other++)
                    listed_as = children[other].inode == r.entry.ino && strcmp(children[other].name, c->name) == 0;
                if (directory != 1 && r.kind == REPLY_ENTRY && r.entry.ino != 0 && !listed_as)
                    violation("forest: lookup of %s gave inode %llu, its listing %llu", c->name,
                              (unsigned long long) r.entry.ino, (unsigned long long) c->inode);
                end(&r);
                ASK_FOREST(&r, f, first, ll_getattr, c->inode, NULL);
                end(&r);
                if (c->type == DT_REG) {
                    ASK_FOREST(&r, f, first, ll_read, c->inode, 4096, 0, &(struct fuse_file_info){0});
                    end(&r);
                } else if (c->type == DT_LNK) {
                    ASK_FOREST(&r, f, first, ll_readlink, c->inode);
                    end(&r);
                } else if (c->type == DT_DIR && pending < WALK_DIRECTORIES) {
                    directories[pending++] = c->inode;
                }
                ASK_FOREST(&r, f, first, ll_listxattr, c->inode, 0);
                end(&r);
            }
            budget -= count < budget ? count : budget;
        }
    }
    ASK_FOREST(&r, f, first, ll_statfs, 1);
    end(&r);
    ASK_FOREST(&r, f, first, ll_getattr, w->inodes + 1, NULL);
    end(&r);
    free(children);
}

#endif
