/* packfs.core._format: the format library (packfs/cformat/) for Python's readers,
 * without FUSE: a Tree over the map and descriptor packfs.core already holds (the
 * same arguments as packfs._lowlevel.Tree), and the hot paths of a reader: a path's
 * entry, its attributes, a whole file's contents, and many files' in one call.  Each
 * call releases the GIL while it searches, reads, checks and decodes; every value read
 * from the archive is checked by the library where it is used, and what it finds
 * broken is raised as packfs.errors' PackfsError:
 *
 *   ENOENT -> PathNotFoundError      EISDIR, a symlink -> NotAFileError
 *   EFBIG  -> TooLargeToReadError    EIO -> ArchiveChangedError (changed in place),
 *   ENOMEM -> MemoryError                   ChecksumError (a CRC did not match), or
 *                                           FormatError (another broken rule)
 *
 * The checksum policy is the Tree's: ``check_once`` checks each record's CRC at its
 * first read (a bitmap, the Python policy's own where it is handed one; a record that
 * failed raises from then on), with ``check_always`` at every read, 0 checks none.
 * This file reads no byte of the archive itself.
 */

#include "tree_object.h"

#include "../cformat/crc.h"
#include "../cformat/codecs.h"
#include "../cformat/lookup.h"
#include "../cformat/records.h"
#include "../cformat/table.h"

#include <stdlib.h>

/* packfs.errors' classes, imported once at module init. */
static PyObject *PathNotFoundError, *NotAFileError, *TooLargeToReadError, *ArchiveChangedError, *ChecksumError,
    *FormatError, *ArchiveIOError;

/* The PackfsError for ``error`` from an operation on ``path`` (checksum: whether it
 * found a CRC that did not match); NULL, with it raised. */
static PyObject *raise_for(Tree *t, int error, int checksum, const char *path, Py_ssize_t length)
{
    PyObject *kind;
    const char *what;
    switch (error) {
    case ENOENT: kind = PathNotFoundError; what = "no such path in the archive"; break;
    case EISDIR: kind = NotAFileError; what = "is a directory, not a file"; break;
    case EINVAL: kind = NotAFileError; what = "is a symlink, not a file"; break;
    case EFBIG: kind = TooLargeToReadError; what = "is larger than max_size"; break;
    case ENOMEM: return PyErr_NoMemory();
    case EIO:
        if (__atomic_load_n(&t->changed, __ATOMIC_RELAXED)) {
            kind = ArchiveChangedError;
            what = "the archive changed in place since it was opened (reopen it)";
        } else if (checksum) {
            kind = ChecksumError;
            what = "checksum mismatch: the archive is damaged there";
        } else {
            kind = FormatError;
            what = "the archive breaks a rule of the format there (logged)";
        }
        break;
    default:
        errno = error;
        return PyErr_SetFromErrno(ArchiveIOError);
    }
    PyObject *name = PyUnicode_DecodeFSDefaultAndSize(path, length);
    if (name != NULL)
        PyErr_Format(kind, "'%s': '%U': %s", t->name, name, what);
    Py_XDECREF(name);
    return NULL;
}

/* Path ``path``'s whole contents, at most ``max_size`` bytes (-1: no limit): *data
 * (malloc'ed) from *skip on, *got bytes.  Without the GIL; an errno, the operation's
 * checksum failure in *checksum. */
static int read_whole(Tree *t, const uint8_t *path, size_t length, long long max_size, uint8_t **data, size_t *got,
                      size_t *skip, int *checksum)
{
    /* one byte more than the limit tells a file over it from one just at it */
    size_t wanted = max_size < 0 || max_size >= PY_SSIZE_T_MAX ? (size_t) PY_SSIZE_T_MAX : (size_t) max_size + 1;
    uint64_t entry = 0;
    checksum_failure = 0;
    *data = NULL;
    *got = *skip = 0;
    int error = tree_find(t, path, length, &entry);
    uint64_t record, start, end, size;
    unsigned type;
    CodecRow row;
    /* A file over max_size is refused before any of it is read (its size held to its
     * rules first): a caller that falls back elsewhere for large files pays nothing. */
    if (!error && max_size >= 0 && (error = typed_entry(t, entry + 1, &entry, &type)) == 0 && type == S_IFREG
        && (error = record_of(t, entry, &record, &start, &end, &row, &size)) == 0 && size > (uint64_t) max_size)
        error = EFBIG;
    if (!error)
        error = tree_read(t, entry + 1, 0, wanted, data, got, skip);
    if (!error && max_size >= 0 && *got > (uint64_t) max_size)
        error = EFBIG;
    error = finished(t, error);
    *checksum = checksum_failure;
    if (error) {
        free(*data);
        *data = NULL;
    }
    return error;
}

static PyObject *bytes_of(uint8_t *data, size_t got, size_t skip)
{
    PyObject *result = PyBytes_FromStringAndSize(data ? (const char *) data + skip : "", (Py_ssize_t) got);
    free(data);
    return result;
}

/* 1 if ``path`` (``length`` bytes) is a canonical key (packfs.core.paths.lookup_key's
 * output): no empty, "." or ".." component, so no leading, trailing or doubled slash. */
static int canonical(const char *path, Py_ssize_t length)
{
    Py_ssize_t start = 0;
    if (length == 0)
        return 0;
    for (Py_ssize_t k = 0; k <= length; k++) {
        if (k < length && path[k] != '/')
            continue;
        Py_ssize_t part = k - start;
        if (part == 0 || (path[start] == '.' && (part == 1 || (part == 2 && path[start + 1] == '.'))))
            return 0;
        start = k + 1;
    }
    return 1;
}

/* Path ``path``'s whole contents as a new bytes object, in three steps: the file found
 * and its record located and held to its rules without the GIL; the bytes object made
 * at the file's size with it (nothing copied twice: no buffer in between); filled
 * without it, straight from the map (or pread) and checked, or decoded into it.  A file
 * over ``max_size`` (-1: no limit) is EFBIG before a byte of it is read.  NULL and
 * *error (and *checksum) for what the library refused; NULL without *error for a
 * Python error (no memory). */
static PyObject *read_as_bytes(Tree *t, const char *path, Py_ssize_t length, long long max_size, int *error,
                               int *checksum)
{
    WholeFile f;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    checksum_failure = 0;
    failed = locate_whole_file(t, (const uint8_t *) path, (size_t) length, &f);
    if (failed || page_failure)
        failed = finished(t, failed);
    else if ((max_size >= 0 && f.size > (uint64_t) max_size) || f.size > (uint64_t) PY_SSIZE_T_MAX)
        failed = EFBIG;
    *checksum = checksum_failure;
    Py_END_ALLOW_THREADS
    *error = failed;
    if (failed)
        return NULL;
    PyObject *result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t) f.size);
    if (result == NULL)
        return NULL;
    uint8_t *into = (uint8_t *) PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    checksum_failure = 0;
    failed = finished(t, read_whole_file(t, &f, into));
    *checksum = checksum_failure;
    Py_END_ALLOW_THREADS
    *error = failed;
    if (failed)
        Py_CLEAR(result);
    return result;
}

PyDoc_STRVAR(read_file_doc,
"read_file(path: bytes, max_size=-1, none_if_larger=False) -> bytes\n\n"
"The whole contents of the file stored at ``path`` (canonical, as Archive.find takes\n"
"it: no leading slash, symlinks not followed), found, read, checked and decoded without\n"
"the GIL, straight into the bytes returned.  A file over ``max_size`` bytes (-1: no\n"
"limit) raises TooLargeToReadError, or with ``none_if_larger`` returns None (nothing of\n"
"it read): a caller that reads large files elsewhere asks without the cost of an\n"
"exception.");

static PyObject *py_read_file(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"path", "max_size", "none_if_larger", NULL};
    Py_buffer path;
    long long max_size = -1;
    int none_if_larger = 0;
    Tree *t = tree_ready(self);
    if (t == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "y*|Lp:read_file", keywords, &path, &max_size,
                                                  &none_if_larger))
        return NULL;
    int error, checksum;
    PyObject *result = read_as_bytes(t, path.buf, path.len, max_size, &error, &checksum);
    if (result == NULL && error == EFBIG && none_if_larger) {
        Py_INCREF(Py_None);
        result = Py_None;
    } else if (result == NULL && error) {
        raise_for(t, error, checksum, path.buf, path.len);
    }
    PyBuffer_Release(&path);
    return result;
}

/* Whether str paths are encoded as UTF-8 (the file system encoding is UTF-8, as
 * lookup_key encodes them): then a str's UTF-8 (cached in the object) is its key. */
static int utf8_paths;

PyDoc_STRVAR(read_path_doc,
"read_path(path: str | bytes, max_size=-1) -> bytes | None\n\n"
"PackedFolder.read's hot path: read_file of ``path`` when it is a canonical key (a\n"
"str as the file system encoding makes it bytes, or bytes), else None, and None for\n"
"whatever the library does not answer: a path not found as given (through a symlink,\n"
"say), not a regular file, over ``max_size``, or a record that fails a check or a rule,\n"
"or an archive changed in place.  The caller asks its Python reader then, which\n"
"answers or raises its own error: one exception class for each kind of damage,\n"
"whichever reader met it.");

static PyObject *py_read_path(PyObject *self, PyObject *const *args, Py_ssize_t count)
{
    Tree *t = tree_ready(self);
    if (t == NULL)
        return NULL;
    if (count < 1 || count > 2) {
        PyErr_SetString(PyExc_TypeError, "read_path(path, max_size=-1)");
        return NULL;
    }
    long long max_size = -1;
    if (count == 2 && (max_size = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    PyObject *path = args[0];
    const char *key;
    Py_ssize_t length;
    if (PyUnicode_CheckExact(path) && utf8_paths) {
        if ((key = PyUnicode_AsUTF8AndSize(path, &length)) == NULL) {
            PyErr_Clear();  /* a lone surrogate: lookup_key's surrogateescape, in Python */
            Py_RETURN_NONE;
        }
    } else if (PyBytes_CheckExact(path)) {
        key = PyBytes_AS_STRING(path);
        length = PyBytes_GET_SIZE(path);
    } else {
        Py_RETURN_NONE;
    }
    if (!canonical(key, length))
        Py_RETURN_NONE;
    int error, checksum;
    /* ``path`` is held by the caller and immutable: its buffer outlives the call. */
    PyObject *result = read_as_bytes(t, key, length, max_size, &error, &checksum);
    if (result == NULL && error)
        Py_RETURN_NONE;
    return result;
}

PyDoc_STRVAR(read_many_doc,
"read_many(paths: sequence of bytes, max_size=-1) -> list of bytes\n\n"
"read_file of each path, in order, in one call (the GIL released once for all of\n"
"them); the first that fails raises, naming its path.");

static PyObject *py_read_many(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"paths", "max_size", NULL};
    PyObject *paths;
    long long max_size = -1;
    Tree *t = tree_ready(self);
    if (t == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "O|L:read_many", keywords, &paths, &max_size))
        return NULL;
    PyObject *items = PySequence_Fast(paths, "read_many: a sequence of paths (bytes)");
    if (items == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    for (Py_ssize_t k = 0; k < count; k++) {
        if (!PyBytes_Check(PySequence_Fast_GET_ITEM(items, k))) {
            Py_DECREF(items);
            PyErr_SetString(PyExc_TypeError, "read_many: each path must be bytes");
            return NULL;
        }
    }
    typedef struct {
        uint8_t *data;
        size_t got, skip;
    } Read;
    Read *reads = calloc((size_t) count + 1, sizeof(Read));
    if (reads == NULL) {
        Py_DECREF(items);
        return PyErr_NoMemory();
    }
    Py_ssize_t failed = -1;
    int error = 0, checksum = 0;
    /* The paths' bytes stay alive and unchanged meanwhile: ``items`` holds them, and
     * bytes objects are immutable. */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count && failed < 0; k++) {
        PyObject *path = PySequence_Fast_GET_ITEM(items, k);
        error = read_whole(t, (const uint8_t *) PyBytes_AS_STRING(path), (size_t) PyBytes_GET_SIZE(path), max_size,
                           &reads[k].data, &reads[k].got, &reads[k].skip, &checksum);
        if (error)
            failed = k;
    }
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (failed >= 0) {
        PyObject *path = PySequence_Fast_GET_ITEM(items, failed);
        raise_for(t, error, checksum, PyBytes_AS_STRING(path), PyBytes_GET_SIZE(path));
    } else {
        result = PyList_New(count);
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *contents = result != NULL ? bytes_of(reads[k].data, reads[k].got, reads[k].skip) : NULL;
        if (result == NULL) {
            free(reads[k].data);
        } else if (contents == NULL) {
            Py_CLEAR(result);
        } else {
            PyList_SET_ITEM(result, k, contents);
        }
    }
    free(reads);
    Py_DECREF(items);
    return result;
}

/* The entry at ``path``, without the GIL: 0 and *entry, or raised (NULL-like: -1). */
static int find_entry(Tree *t, Py_buffer *path, uint64_t *entry, struct stat *st)
{
    int error, checksum;
    Py_BEGIN_ALLOW_THREADS
    checksum_failure = 0;
    error = tree_find(t, path->buf, (size_t) path->len, entry);
    if (!error && st != NULL)
        error = entry_stat(t, *entry, st);
    error = finished(t, error);
    checksum = checksum_failure;
    Py_END_ALLOW_THREADS
    if (error) {
        raise_for(t, error, checksum, path->buf, path->len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(find_doc,
"find(path: bytes) -> int: the index of the entry stored at ``path`` (canonical), by the\n"
"path_hash index; PathNotFoundError if there is none.");

static PyObject *py_find(PyObject *self, PyObject *args)
{
    Py_buffer path;
    uint64_t entry;
    Tree *t = tree_ready(self);
    if (t == NULL || !PyArg_ParseTuple(args, "y*:find", &path))
        return NULL;
    int status = find_entry(t, &path, &entry, NULL);
    PyBuffer_Release(&path);
    return status ? NULL : PyLong_FromUnsignedLongLong(entry);
}

PyDoc_STRVAR(stat_doc,
"stat(path: bytes) -> dict of st_*: the attributes of the entry stored at ``path``\n"
"(st_ino is its entry + 1, a hard link's first name's), each held to its rule.");

static PyObject *py_stat(PyObject *self, PyObject *args)
{
    Py_buffer path;
    uint64_t entry;
    struct stat st;
    Tree *t = tree_ready(self);
    if (t == NULL || !PyArg_ParseTuple(args, "y*:stat", &path))
        return NULL;
    int status = find_entry(t, &path, &entry, &st);
    PyBuffer_Release(&path);
    return status ? NULL : stat_tuple(&st);
}

static PyObject *py_changed(PyObject *self, PyObject *unused)
{
    Tree *t = tree_ready(self);
    return t == NULL ? NULL : PyBool_FromLong(tree_changed(t));
}

static int tree_init(TreeObject *o, PyObject *args, PyObject *kwargs)
{
    return tree_object_open(o, args, kwargs, "Tree");
}

static void tree_dealloc(TreeObject *o)
{
    tree_object_release(o);
    Py_TYPE(o)->tp_free((PyObject *) o);
}

static PyMethodDef tree_methods[] = {
    {"find", (PyCFunction) py_find, METH_VARARGS, find_doc},
    {"stat", (PyCFunction) py_stat, METH_VARARGS, stat_doc},
    {"read_file", (PyCFunction) (void (*)(void)) py_read_file, METH_VARARGS | METH_KEYWORDS, read_file_doc},
    {"read_path", (PyCFunction) (void (*)(void)) py_read_path, METH_FASTCALL, read_path_doc},
    {"read_many", (PyCFunction) (void (*)(void)) py_read_many, METH_VARARGS | METH_KEYWORDS, read_many_doc},
    {"changed", (PyCFunction) py_changed, METH_NOARGS, "changed() -> bool: the archive changed in place since open."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(tree_doc,
"Tree(mapping, fd, guard, records, data_records, entries, sections, check_once, name, log_fd=2,\n"
"     pieces=None, xattrs=None, pages=None, codecs=None, check_always=False,\n"
"     checked_bits=None, failed_bits=None)\n\n"
"An open archive as the format library reads it, over what packfs.core holds: the\n"
"archive's map, its descriptor (duplicated), the map's packfs._sigbus slot or -1, and\n"
"the spans of its sections (as packfs._lowlevel.Tree takes them), each checked again.\n"
"``check_always``: every read checks its record (packfs.core's \"always\"); else each\n"
"record once, its verdicts kept in ``checked_bits`` and ``failed_bits`` when given (a\n"
"\"once\" ChecksumPolicy's bytearrays, a bit per data record: shared with Python's reader).");

static PyTypeObject TreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packfs.core._format.Tree",
    .tp_basicsize = sizeof(TreeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = tree_doc,
    .tp_new = tree_object_new,
    .tp_init = (initproc) tree_init,
    .tp_dealloc = (destructor) tree_dealloc,
    .tp_methods = tree_methods,
};

/* The node cache's blocks as C reads them (blockcache.c), for the tests that hold it
 * and packfs.source.cache to the same chunk files. */
static PyObject *py_read_cached(PyObject *module, PyObject *args)
{
    int dir_fd;
    const char *relative;
    unsigned int salt;
    unsigned long long size, at, count;
    if (!PyArg_ParseTuple(args, "isIKKK:read_cached", &dir_fd, &relative, &salt, &size, &at, &count))
        return NULL;
    if (count > ((uint64_t) 64 << 20))
        return PyErr_Format(PyExc_ValueError, "read_cached: at most 64 MiB at once");
    BlockCache cache;
    int error = blockcache_open(&cache, dir_fd, relative, (uint32_t) salt, size);
    if (error != 0)
        return error == EINVAL ? PyErr_Format(PyExc_ValueError, "read_cached: a bad directory name") : os_error(error);
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t) count);
    if (data != NULL) {
        Py_BEGIN_ALLOW_THREADS
        error = blockcache_read(&cache, (uint8_t *) PyBytes_AS_STRING(data), count, at);
        Py_END_ALLOW_THREADS
    }
    blockcache_close(&cache);
    if (data != NULL && error != 0) {
        Py_DECREF(data);
        Py_RETURN_NONE;
    }
    return data;
}

/* The CRC-32 C checks cache blocks with (crc.c), for the test that holds it to zlib's. */
static PyObject *py_crc32(PyObject *module, PyObject *args)
{
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32", &data, &value))
        return NULL;
    uint32_t crc = crc_update(value, data.buf, (size_t) data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef module_methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, value=0) -> int: zlib.crc32's value, as C computes it."},
    {"read_cached", py_read_cached, METH_VARARGS,
     "read_cached(dir_fd, relative, salt, size, at, count) -> bytes or None: ``count`` bytes at ``at``\n"
     "of the archive whose node-cache directory is ``relative`` below ``dir_fd``, read and checked\n"
     "in C as the compiled daemon reads them; None when a block is missing or fails its check."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "packfs.core._format",
    "The C format library for Python readers, without FUSE (see packfs/cpython/_format_module.c).",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__format(void)
{
    PyObject *errors = PyImport_ImportModule("packfs.errors");
    if (errors == NULL)
        return NULL;
    struct {
        PyObject **slot;
        const char *name;
    } classes[] = {{&PathNotFoundError, "PathNotFoundError"}, {&NotAFileError, "NotAFileError"},
                   {&TooLargeToReadError, "TooLargeToReadError"}, {&ArchiveChangedError, "ArchiveChangedError"},
                   {&ChecksumError, "ChecksumError"}, {&FormatError, "FormatError"},
                   {&ArchiveIOError, "ArchiveIOError"}};
    for (size_t k = 0; k < sizeof classes / sizeof classes[0]; k++) {
        if ((*classes[k].slot = PyObject_GetAttrString(errors, classes[k].name)) == NULL) {
            Py_DECREF(errors);
            return NULL;
        }
    }
    Py_DECREF(errors);
    PyObject *encoding = PySys_GetObject("getfilesystemencoding");  /* borrowed */
    PyObject *name = encoding != NULL ? PyObject_CallNoArgs(encoding) : NULL;
    if (name == NULL)
        return NULL;
    utf8_paths = PyUnicode_CompareWithASCIIString(name, "utf-8") == 0;
    Py_DECREF(name);
    if (PyType_Ready(&TreeType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL)
        return NULL;
    pthread_atfork(decoded_before_fork, decoded_after_fork, decoded_after_fork);
    Py_INCREF(&TreeType);
    if (PyModule_AddObject(module, "Tree", (PyObject *) &TreeType) != 0
        || PyModule_AddIntConstant(module, "ZSTD_VERSION", zstd_version()) != 0) {
        Py_DECREF(&TreeType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
