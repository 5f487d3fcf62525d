/* packfs._lowlevel: the compiled, inode-based FUSE daemon's Python types.
 *
 * Python opens and checks the archive (the format's open-time rules, packfs.core),
 * then hands a Tree the archive's map, its descriptor, the SIGBUS guard's slot and
 * where each section lies; tree_open (packfs/cformat/table.c) checks them again.  From
 * then on every request is served by the format library (packfs/cformat/: table.c,
 * lookup.c, records.c, codecs.c, forest.c) through the FUSE glue (fuse_ops.c), on
 * libfuse's own worker threads, without the GIL.
 *
 * The methods here (lookup, getattr, readdir, read, read_file, ...) run the same
 * operations for tests and the fuzzers; Tree.read_file (tree_find, then a read of the
 * whole file) is the in-process read path.  A Forest serves several Trees as one (a
 * shard set); a Tree alone is a forest of one.  This file reads no byte of the archive.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fuse_ops.h"

#include "../cformat/codecs.h"
#include "../cformat/forest.h"
#include "../cformat/lookup.h"
#include "../cformat/records.h"
#include "../cformat/table.h"
#include "../cpython/tree_object.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* -- the Tree type ---------------------------------------------------------------------------- */

static int tree_init(TreeObject *o, PyObject *args, PyObject *kwargs)
{
    if (tree_object_open(o, args, kwargs, "Tree") != 0)
        return -1;
    if (forest_of_one(&o->tree) != 0) {
        o->tree.initialised = 0;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void tree_dealloc(TreeObject *o)
{
    Tree *t = &o->tree;
    if (t->alone != NULL && t->alone->session != NULL)  /* mounted, never run */
        end_session(t->alone, t->alone->session);
    free(t->alone);
    tree_object_release(o);
    Py_TYPE(o)->tp_free((PyObject *) o);
}

/* The methods below serve a Tree (as a forest of one) and a Forest alike. */
static PyTypeObject TreeType;
static Forest *forest_arg(PyObject *self);

/* The Tree of the shard that holds the Forest's ``inode``, and the entry's inode in it;
 * NULL with OSError set (ENOENT, EIO) where there is none. */
static Tree *shard_of(Forest *f, unsigned long long inode, uint64_t *local)
{
    Tree *t;
    unsigned shard;
    int error = resolve(f, inode, &t, &shard, local);
    if (error) {
        os_error(error);
        return NULL;
    }
    return t;
}

PyDoc_STRVAR(lookup_doc, "lookup(parent_inode, name: bytes) -> dict of st_* (LOOKUP); OSError with the errno.");

static PyObject *py_lookup(PyObject *self, PyObject *args)
{
    unsigned long long parent;
    Py_buffer name;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "Ky*:lookup", &parent, &name))
        return NULL;
    struct stat st;
    int error = forest_lookup(f, parent, name.buf, (size_t) name.len, &st);
    PyBuffer_Release(&name);
    if (error)
        return os_error(error);
    return stat_tuple(&st);
}

PyDoc_STRVAR(getattr_doc, "getattr(inode) -> dict of st_* (GETATTR); OSError with the errno.");

static PyObject *py_getattr(PyObject *self, PyObject *args)
{
    unsigned long long inode;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "K:getattr", &inode))
        return NULL;
    struct stat st;
    int error = forest_getattr(f, inode, &st);
    if (error)
        return os_error(error);
    return stat_tuple(&st);
}

PyDoc_STRVAR(readdir_doc,
"readdir(inode, offset=0, plus=False) -> [(name: bytes, st_ino, st_mode, next_offset)]\n"
"(READDIR's entries, . and .. first); with ``plus``, READDIRPLUS's: each tuple ends with\n"
"the attributes handed with the name (a dict of st_*), or None where none are (. and\n"
"..; a child whose attributes break a rule).  OSError with the errno.");

typedef struct {
    PyObject *items;               /* NULL once a Python error is set */
    int plus;
} ListingList;

static int add_to_list(void *context, const char *name, const struct stat *st, int attributes, uint64_t next)
{
    ListingList *list = context;
    if (list->items == NULL)
        return 1;
    PyObject *item;
    if (list->plus) {
        PyObject *handed = Py_None;
        if (attributes)
            handed = stat_tuple(st);
        else
            Py_INCREF(Py_None);
        item = handed == NULL ? NULL : Py_BuildValue("(y#KIKN)", name, (Py_ssize_t) strlen(name),
                                                     (unsigned long long) st->st_ino, (unsigned) st->st_mode,
                                                     (unsigned long long) next, handed);
    } else {
        item = Py_BuildValue("(y#KIK)", name, (Py_ssize_t) strlen(name), (unsigned long long) st->st_ino,
                             (unsigned) st->st_mode, (unsigned long long) next);
    }
    if (item == NULL || PyList_Append(list->items, item) != 0)
        Py_CLEAR(list->items);
    Py_XDECREF(item);
    return list->items == NULL;
}

static PyObject *py_readdir(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"inode", "offset", "plus", NULL};
    unsigned long long inode, offset = 0;
    int plus = 0;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "K|Kp:readdir", keywords, &inode, &offset, &plus))
        return NULL;
    ListingList list = {PyList_New(0), plus};
    if (list.items == NULL)
        return NULL;
    int error = forest_listing(f, inode, offset, plus, UINT64_MAX, add_to_list, &list);
    if (list.items == NULL)
        return NULL;
    if (error) {
        Py_DECREF(list.items);
        return os_error(error);
    }
    return list.items;
}

PyDoc_STRVAR(read_doc, "read(inode, offset, size) -> bytes (READ); OSError with the errno.");

static PyObject *py_read(PyObject *self, PyObject *args)
{
    unsigned long long inode, offset;
    Py_ssize_t size;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "KKn:read", &inode, &offset, &size))
        return NULL;
    if (size < 0 || (size_t) size > MAX_REQUEST)
        return os_error(EINVAL);
    uint64_t local;
    Tree *t = shard_of(f, inode, &local);
    if (t == NULL)
        return NULL;
    uint8_t *data = NULL;
    size_t got = 0, skip = 0;
    int error;
    Py_BEGIN_ALLOW_THREADS
    error = finished(t, tree_read(t, local, offset, (size_t) size, &data, &got, &skip));
    Py_END_ALLOW_THREADS
    if (error) {
        free(data);
        return os_error(error);
    }
    PyObject *result = PyBytes_FromStringAndSize(data ? (const char *) data + skip : "", (Py_ssize_t) got);
    free(data);
    return result;
}


PyDoc_STRVAR(read_file_doc,
"read_file(path, max_size=-1) -> bytes: the whole contents of the file stored at ``path``\n"
"(bytes, canonical as Archive.find takes it: no leading slash, symlinks not followed),\n"
"found, read, checked and decoded in C in one call, without the GIL: the in-process read\n"
"path (what a READ of each part of it answers).  A file over ``max_size`` bytes (-1: no\n"
"limit) is EFBIG, having allocated at most ``max_size`` + 1 bytes: a compressed or sparse\n"
"file's size is not bounded by the archive's.  OSError with the errno: ENOENT, EISDIR for\n"
"a directory, EINVAL for a symlink, EIO for a damaged or changed archive, ENOMEM.");

static PyObject *py_read_file(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"path", "max_size", NULL};
    Py_buffer path;
    long long max_size = -1;
    Tree *t = tree_ready(self);
    if (t == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "y*|L:read_file", keywords, &path, &max_size))
        return NULL;
    /* one byte more than the limit tells a file over it from one just at it */
    size_t wanted = max_size < 0 || max_size >= PY_SSIZE_T_MAX ? (size_t) PY_SSIZE_T_MAX : (size_t) max_size + 1;
    uint64_t entry = 0;
    uint8_t *data = NULL;
    size_t got = 0, skip = 0;
    int error;
    Py_BEGIN_ALLOW_THREADS
    error = tree_find(t, path.buf, (size_t) path.len, &entry);
    /* All of it: a READ of the whole file (its type, size and record held to their rules
     * there), one entry read for its own contents, not for a hard link's first name. */
    if (!error)
        error = read_or_park(t, entry + 1, 0, wanted, &data, &got, &skip, NULL);
    if (!error && max_size >= 0 && got > (uint64_t) max_size)
        error = EFBIG;
    error = finished(t, error);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&path);
    if (error) {
        free(data);
        return os_error(error);
    }
    PyObject *result = PyBytes_FromStringAndSize(data ? (const char *) data + skip : "", (Py_ssize_t) got);
    free(data);
    return result;
}

PyDoc_STRVAR(readlink_doc, "readlink(inode) -> bytes (READLINK); OSError with the errno.");

static PyObject *py_readlink(PyObject *self, PyObject *args)
{
    unsigned long long inode;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "K:readlink", &inode))
        return NULL;
    uint64_t local;
    char target[MAX_SYMLINK_TARGET + 1];
    Tree *t = shard_of(f, inode, &local);
    if (t == NULL)
        return NULL;
    int error = finished(t, tree_readlink(t, local, target));
    if (error)
        return os_error(error);
    return PyBytes_FromString(target);
}

PyDoc_STRVAR(getxattr_doc, "getxattr(inode, name: bytes) -> bytes (GETXATTR); OSError with the errno.");

static PyObject *py_getxattr(PyObject *self, PyObject *args)
{
    unsigned long long inode;
    const char *name;
    Py_ssize_t length;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "Ky#:getxattr", &inode, &name, &length))
        return NULL;
    uint64_t local;
    Tree *t = shard_of(f, inode, &local);
    if (t == NULL)
        return NULL;
    if (!f->xattrs)
        return os_error(finished(t, ENOSYS));
    XattrQuery q;
    memset(&q, 0, sizeof q);
    q.wanted = (const uint8_t *) name;
    q.wanted_length = (size_t) length;
    int error = tree_xattrs(t, local, &q);
    if (!error && !q.found)
        error = ENODATA;
    PyObject *value = error ? NULL : PyBytes_FromStringAndSize((const char *) q.value, q.value_length);
    if ((error = finished(t, error)) != 0) {
        Py_XDECREF(value);
        return os_error(error);
    }
    return value;
}

PyDoc_STRVAR(listxattr_doc, "listxattr(inode) -> bytes, names each ending in NUL (LISTXATTR); OSError with the errno.");

static PyObject *py_listxattr(PyObject *self, PyObject *args)
{
    unsigned long long inode;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "K:listxattr", &inode))
        return NULL;
    uint64_t local;
    Tree *t = shard_of(f, inode, &local);
    if (t == NULL)
        return NULL;
    uint8_t *names = malloc(XATTR_LIST_LIMIT);
    if (names == NULL)
        return PyErr_NoMemory();
    XattrQuery q;
    memset(&q, 0, sizeof q);
    q.names = names;
    q.names_capacity = XATTR_LIST_LIMIT;
    int error = finished(t, tree_xattrs(t, local, &q));
    PyObject *result = error ? os_error(error) : PyBytes_FromStringAndSize((const char *) names, q.names_length);
    free(names);
    return result;
}


PyDoc_STRVAR(mount_doc,
"mount(mountpoint, options: str, debug=False)\n\n"
"Mount at ``mountpoint`` with libfuse's ``-o options`` (a comma-separated string);\n"
"SIGINT, SIGTERM and SIGHUP will end :meth:`run`.  RuntimeError if libfuse refused\n"
"the options or could not mount (it printed why on stderr).");

static PyObject *py_mount(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"mountpoint", "options", "debug", NULL};
    const char *mountpoint, *options;
    int debug = 0;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "ss|p:mount", keywords, &mountpoint, &options,
                                                  &debug))
        return NULL;
    for (uint64_t s = 0; s < f->count; s++) {
        if (f->trees[s]->guard < 0) {
            PyErr_SetString(PyExc_ValueError, "serving needs the map guarded by packfs._sigbus");
            return NULL;
        }
    }
    if (f->session != NULL) {
        PyErr_SetString(PyExc_ValueError, "already mounted");
        return NULL;
    }
    const char *why = NULL;
    int mounted;
    Py_BEGIN_ALLOW_THREADS
    mounted = daemon_mount(f, mountpoint, options, debug, &why);
    Py_END_ALLOW_THREADS
    if (mounted != 0) {
        PyErr_SetString(PyExc_RuntimeError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(run_doc,
"run(threads=0, clone_fd=False, max_idle_threads=-1) -> int\n\n"
"Serve the mount until it is unmounted or a signal stops it, then unmount; the GIL is\n"
"released meanwhile.  ``threads``: 1 serves one request at a time, N > 1 with at most\n"
"N worker threads (libfuse 3.12 or later), 0 libfuse's default; the other two are\n"
"libfuse's loop options of those names (-1: its default).  Returns the session\n"
"loop's status: 0 when unmounted, the signal's number when stopped by one (libfuse\n"
"3.12 or later), negative errno on failure.");

static PyObject *py_run(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"threads", "clone_fd", "max_idle_threads", NULL};
    int threads = 0, clone_fd = 0, idle = -1;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "|ipi:run", keywords, &threads, &clone_fd, &idle))
        return NULL;
    struct fuse_session *session = f->session;
    if (session == NULL) {
        PyErr_SetString(PyExc_ValueError, "not mounted");
        return NULL;
    }
#ifndef PACKFS_FUSE_312
    if (threads > 1) {
        PyErr_SetString(PyExc_ValueError, "a thread limit needs libfuse 3.12 or later");
        return NULL;
    }
#endif
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = daemon_run(f, threads, clone_fd, idle);
    Py_END_ALLOW_THREADS
    f->session = NULL;
    return PyLong_FromLong(status);
}

PyDoc_STRVAR(override_doc,
"override(uid=-1, gid=-1, umask=-1, direct_io=False)\n\n"
"Show every entry with this owner, group, or permission bits masked (-o uid=, gid=,\n"
"umask=, as libfuse's high-level API does; -1 keeps what the archive stores); with\n"
"``direct_io``, files are opened so that every read reaches the daemon (-o direct_io).");

static PyObject *py_override(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"uid", "gid", "umask", "direct_io", NULL};
    long long uid = -1, gid = -1, umask_bits = -1;
    int direct_io = 0;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "|LLLp:override", keywords, &uid, &gid, &umask_bits,
                                                  &direct_io))
        return NULL;
    if (uid < -1 || uid >= UINT32_MAX || gid < -1 || gid >= UINT32_MAX || umask_bits < -1 || umask_bits > 07777) {
        PyErr_SetString(PyExc_ValueError, "uid and gid must be below 2**32 - 1, umask at most 0o7777");
        return NULL;
    }
    for (uint64_t s = 0; s < f->count; s++) {
        Tree *t = f->trees[s];
        t->uid = uid;
        t->gid = gid;
        t->umask = umask_bits;
        t->direct_io = direct_io;
    }
    Py_RETURN_NONE;
}

static PyObject *py_changed(PyObject *self, PyObject *unused)
{
    Tree *t = tree_ready(self);
    if (t == NULL)
        return NULL;
    return PyBool_FromLong(tree_changed(t));
}

PyDoc_STRVAR(hold_checks_doc,
"hold_checks(hold: bool)\n\n"
"For tests: while held, a check of a whole record read from the archive (a large file\n"
"without piece CRCs) waits, once it has claimed its record, before it reads: the\n"
"readers of that record wait for it (READs are parked), and nobody else does.");

static PyObject *py_hold_checks(PyObject *self, PyObject *args)
{
    int hold;
    Tree *t = tree_ready(self);
    if (t == NULL || !PyArg_ParseTuple(args, "p:hold_checks", &hold))
        return NULL;
    pthread_mutex_lock(&t->checks_lock);
    t->hold_checks = hold;
    pthread_cond_broadcast(&t->check_ended);
    pthread_mutex_unlock(&t->checks_lock);
    Py_RETURN_NONE;
}

static PyObject *py_checking(PyObject *self, PyObject *unused)
{
    Tree *t = tree_ready(self);
    if (t == NULL)
        return NULL;
    pthread_mutex_lock(&t->checks_lock);
    unsigned claimed = t->claimed_count, parked = t->parked_count;
    pthread_mutex_unlock(&t->checks_lock);
    return Py_BuildValue("(II)", claimed, parked);
}

static PyObject *py_decodes(PyObject *self, PyObject *unused)
{
    Tree *t = tree_ready(self);
    if (t == NULL)
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&t->decodes, __ATOMIC_RELAXED));
}

static PyObject *py_remote_counts(PyObject *self, PyObject *unused)
{
    return tree_ready(self) == NULL ? NULL : tree_remote_counts((TreeObject *) self);
}

static PyMethodDef tree_methods[] = {
    {"remote_counts", (PyCFunction) py_remote_counts, METH_NOARGS,
     "remote_counts() -> dict: a remote archive's cache_hits (blocks read from the node cache in C)\n"
     "and cache_misses (reads handed to the reader)."},
    {"lookup", (PyCFunction) py_lookup, METH_VARARGS, lookup_doc},
    {"getattr", (PyCFunction) py_getattr, METH_VARARGS, getattr_doc},
    {"readdir", (PyCFunction) (void (*)(void)) py_readdir, METH_VARARGS | METH_KEYWORDS, readdir_doc},
    {"read", (PyCFunction) py_read, METH_VARARGS, read_doc},
    {"readlink", (PyCFunction) py_readlink, METH_VARARGS, readlink_doc},
    {"getxattr", (PyCFunction) py_getxattr, METH_VARARGS, getxattr_doc},
    {"listxattr", (PyCFunction) py_listxattr, METH_VARARGS, listxattr_doc},
    {"mount", (PyCFunction) (void (*)(void)) py_mount, METH_VARARGS | METH_KEYWORDS, mount_doc},
    {"run", (PyCFunction) (void (*)(void)) py_run, METH_VARARGS | METH_KEYWORDS, run_doc},
    {"override", (PyCFunction) (void (*)(void)) py_override, METH_VARARGS | METH_KEYWORDS, override_doc},
    {"changed", (PyCFunction) py_changed, METH_NOARGS, "changed() -> bool: the archive changed in place since open."},
    {"hold_checks", (PyCFunction) py_hold_checks, METH_VARARGS, hold_checks_doc},
    {"checking", (PyCFunction) py_checking, METH_NOARGS,
     "checking() -> (records, reads): the records being checked from the archive now (claimed),\n"
     "and the READs parked until those checks end."},
    {"read_file", (PyCFunction) (void (*)(void)) py_read_file, METH_VARARGS | METH_KEYWORDS, read_file_doc},
    {"decodes", (PyCFunction) py_decodes, METH_NOARGS,
     "decodes() -> int: how many zstd files and frames were decoded (format 1.5's codecs): what\n"
     "the kept decoded bytes save is seen here."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(tree_doc,
"Tree(mapping, fd, guard, records, data_records, entries, sections, check_once, name, log_fd=2)\n\n"
"An archive's path table as the compiled daemon serves it: ``mapping`` the whole\n"
"archive's map, ``fd`` its descriptor (duplicated), ``guard`` the map's packfs._sigbus\n"
"slot or -1, ``sections`` the 15 (start, end) spans of the table's columns, and\n"
"``check_once`` whether each record's CRC is checked at its first read; problems\n"
"are logged to ``log_fd`` (not closed here), each once.  Keywords: ``pieces`` and\n"
"``xattrs``, the spans of format sections 4b and 4c; ``pages``, format 1.4's page\n"
"checks (Archive.page_checks: 23 regions, 25 with codecs); ``codecs``, the spans of a\n"
"1.5 archive's record_codec and codec_data sections (section 4f), whose files are then\n"
"decoded as their codec rows say.");

static PyTypeObject TreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packfs._lowlevel.Tree",
    .tp_basicsize = sizeof(TreeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = tree_doc,
    .tp_new = tree_object_new,
    .tp_init = (initproc) tree_init,
    .tp_dealloc = (destructor) tree_dealloc,
    .tp_methods = tree_methods,
};

/* -- the Forest type ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    Forest forest;
    PyObject *tree_objects;        /* a tuple: the trees outlive the forest */
    int initialised;
} ForestObject;

static PyTypeObject ForestType;

static Forest *forest_arg(PyObject *self)
{
    if (PyObject_TypeCheck(self, &ForestType)) {
        ForestObject *o = (ForestObject *) self;
        if (!o->initialised) {
            PyErr_SetString(PyExc_ValueError, "the Forest is not initialised");
            return NULL;
        }
        return &o->forest;
    }
    Tree *t = tree_ready(self);
    return t != NULL ? t->alone : NULL;
}

static int alias_order(const void *a, const void *b)
{
    uint64_t x = ((const Alias *) a)->entry, y = ((const Alias *) b)->entry;
    return (x > y) - (x < y);
}

static int init_shared(ForestObject *o, PyObject *items)
{
    Forest *f = &o->forest;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    uint64_t total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, k), *parts;
        unsigned long long canonical, nlink;
        if (!PyArg_ParseTuple(item, "KKO", &canonical, &nlink, &parts))
            return -1;
        Py_ssize_t length = PySequence_Length(parts);
        if (length < 1)
            return length < 0 ? -1 : (PyErr_SetString(PyExc_ValueError, "a shared directory without parts"), -1);
        total += (uint64_t) length;
    }
    f->shared = calloc((size_t) n + 1, sizeof(Shared));
    f->parts = calloc(total + 1, sizeof(Part));
    f->aliases = calloc(total + 1, sizeof(Alias));
    if (f->shared == NULL || f->parts == NULL || f->aliases == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, k), *parts;
        unsigned long long canonical, nlink;
        if (!PyArg_ParseTuple(item, "KKO", &canonical, &nlink, &parts))
            return -1;
        Shared *d = f->shared + k;
        if (canonical >= f->bases[f->count] || (k > 0 && canonical <= d[-1].canonical)) {
            PyErr_SetString(PyExc_ValueError, "shared directories: canonical entries must ascend, within the set");
            return -1;
        }
        PyObject *list = PySequence_Fast(parts, "a shared directory's parts: a sequence of (shard, entry)");
        if (list == NULL)
            return -1;
        d->canonical = canonical;
        d->nlink = nlink;
        d->first_part = f->part_count;
        d->parts = (uint64_t) PySequence_Fast_GET_SIZE(list);
        d->canonical_part = UINT64_MAX;
        for (uint64_t i = 0; i < d->parts; i++) {
            unsigned shard;
            unsigned long long entry;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(list, i), "IK", &shard, &entry)) {
                Py_DECREF(list);
                return -1;
            }
            if (shard >= f->count || entry >= f->trees[shard]->entries) {
                Py_DECREF(list);
                PyErr_Format(PyExc_ValueError, "a shared directory's part (%u, %llu) is outside the set", shard, entry);
                return -1;
            }
            Part *p = f->parts + f->part_count;
            p->tree = f->trees[shard];
            p->shard = shard;
            p->directory = entry;
            if (f->bases[shard] + entry == canonical)
                d->canonical_part = f->part_count;
            f->aliases[f->part_count].entry = f->bases[shard] + entry;
            f->aliases[f->part_count].shared = (uint64_t) k;
            f->part_count++;
        }
        Py_DECREF(list);
        if (d->canonical_part == UINT64_MAX) {
            PyErr_Format(PyExc_ValueError, "shared directory %llu is none of its parts", canonical);
            return -1;
        }
        f->shared_count++;
    }
    f->alias_count = f->part_count;
    qsort(f->aliases, f->alias_count, sizeof(Alias), alias_order);
    for (uint64_t i = 1; i < f->alias_count; i++) {
        if (f->aliases[i].entry == f->aliases[i - 1].entry) {
            PyErr_Format(PyExc_ValueError, "entry %llu is a part of two shared directories",
                         (unsigned long long) f->aliases[i].entry);
            return -1;
        }
    }
    return 0;
}

static int forest_init(ForestObject *o, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"trees", "shared", NULL};
    PyObject *trees, *shared;
    if (o->tree_objects != NULL) {
        PyErr_SetString(PyExc_TypeError, "a Forest is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:Forest", keywords, &trees, &shared))
        return -1;
    if ((o->tree_objects = PySequence_Tuple(trees)) == NULL)
        return -1;
    Forest *f = &o->forest;
    Py_ssize_t count = PyTuple_GET_SIZE(o->tree_objects);
    if (count < 1 || (uint64_t) count > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a Forest needs 1 to 2**32 - 1 trees");
        return -1;
    }
    f->trees = calloc((size_t) count, sizeof(Tree *));
    f->bases = calloc((size_t) count + 1, sizeof(uint64_t));
    if (f->trees == NULL || f->bases == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t s = 0; s < count; s++) {
        PyObject *item = PyTuple_GET_ITEM(o->tree_objects, s);
        if (!PyObject_TypeCheck(item, &TreeType)) {
            PyErr_SetString(PyExc_TypeError, "a Forest's trees must be packfs._lowlevel.Tree objects");
            return -1;
        }
        Tree *t = tree_ready(item);
        if (t == NULL)
            return -1;
        f->trees[s] = t;
        f->bases[s + 1] = f->bases[s] + t->entries;
        f->xattrs |= t->xattr_entries != 0;
    }
    f->count = (uint64_t) count;
    pthread_mutex_init(&f->prepare_lock, NULL);
    /* What opening mapped of each shard (its header, tail, footer, first and last paths:
     * whole folios, 0.4 MiB a shard of 1.8 MiB) leaves RSS, which would otherwise grow
     * with the number of shards; each tree maps back what it uses. */
    long page = sysconf(_SC_PAGESIZE);
    for (uint64_t s = 0; s < f->count; s++) {
        uintptr_t start = (uintptr_t) f->trees[s]->base, length = (uintptr_t) f->trees[s]->file_size;
        if (f->trees[s]->guard >= 0)  /* a map (on a page), not a fuzzer's heap buffer */
            madvise((void *) start, length & ~((uintptr_t) page - 1), MADV_DONTNEED);
    }
    PyObject *items = PySequence_Fast(shared, "shared: a sequence of (canonical entry, nlink, parts)");
    if (items == NULL)
        return -1;
    int status = init_shared(o, items);
    Py_DECREF(items);
    if (status != 0)
        return -1;
    o->initialised = 1;
    return 0;
}

static void forest_dealloc(ForestObject *o)
{
    Forest *f = &o->forest;
    if (f->session != NULL)  /* mounted, never run */
        end_session(f, f->session);
    for (uint64_t i = 0; i < f->part_count; i++) {
        if (f->parts[i].owns_name)
            free((void *) f->parts[i].first_name);
    }
    free(f->parts);
    free(f->shared);
    free(f->aliases);
    free(f->trees);
    free(f->bases);
    Py_XDECREF(o->tree_objects);
    Py_TYPE(o)->tp_free((PyObject *) o);
}

static PyMethodDef forest_methods[] = {
    {"lookup", (PyCFunction) py_lookup, METH_VARARGS, lookup_doc},
    {"getattr", (PyCFunction) py_getattr, METH_VARARGS, getattr_doc},
    {"readdir", (PyCFunction) (void (*)(void)) py_readdir, METH_VARARGS | METH_KEYWORDS, readdir_doc},
    {"read", (PyCFunction) py_read, METH_VARARGS, read_doc},
    {"readlink", (PyCFunction) py_readlink, METH_VARARGS, readlink_doc},
    {"getxattr", (PyCFunction) py_getxattr, METH_VARARGS, getxattr_doc},
    {"listxattr", (PyCFunction) py_listxattr, METH_VARARGS, listxattr_doc},
    {"mount", (PyCFunction) (void (*)(void)) py_mount, METH_VARARGS | METH_KEYWORDS, mount_doc},
    {"run", (PyCFunction) (void (*)(void)) py_run, METH_VARARGS | METH_KEYWORDS, run_doc},
    {"override", (PyCFunction) (void (*)(void)) py_override, METH_VARARGS | METH_KEYWORDS, override_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(forest_doc,
"Forest(trees, shared)\n\n"
"Several Trees served as one (a shard set): tree s's inode i is the forest's\n"
"bases[s] + i, bases[s] the entries of the trees before it; ``shared`` lists each\n"
"directory several trees hold as (canonical entry, nlink, [(tree, entry), ...]) with its\n"
"parts in listing order, canonical entries ascending (nlink 0: 2 and the parts'\n"
"subdirectories, a name repeated at a seam once).  The same methods as a Tree's.");

static PyTypeObject ForestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packfs._lowlevel.Forest",
    .tp_basicsize = sizeof(ForestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = forest_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc) forest_init,
    .tp_dealloc = (destructor) forest_dealloc,
    .tp_methods = forest_methods,
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "packfs._lowlevel",
    "The compiled, inode-based FUSE daemon on libfuse3's low-level API (see packfs/cdaemon/).",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lowlevel(void)
{
    if (PyType_Ready(&TreeType) < 0 || PyType_Ready(&ForestType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL)
        return NULL;
    pthread_atfork(decoded_before_fork, decoded_after_fork, decoded_after_fork);
    Py_INCREF(&TreeType);
    Py_INCREF(&ForestType);
    if (PyModule_AddObject(module, "Tree", (PyObject *) &TreeType) != 0
        || PyModule_AddObject(module, "Forest", (PyObject *) &ForestType) != 0
        || PyModule_AddIntConstant(module, "FUSE_VERSION", daemon_fuse_version()) != 0
        || PyModule_AddIntConstant(module, "MAX_REQUEST", MAX_REQUEST) != 0
        || PyModule_AddIntConstant(module, "ZSTD_VERSION", zstd_version()) != 0) {
        Py_DECREF(&TreeType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
