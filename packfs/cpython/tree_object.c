/* A format library Tree held by a Python object, and the constructor's arguments, from Python: the archive's map and descriptor, the
 * SIGBUS guard's slot, and the spans packfs.core found at open (format sections 1-4f),
 * converted to a TreeSpans for tree_open, which checks every one of them again.  This
 * file reads no byte of the archive. */

#include "tree_object.h"

#include "../_sigbus.h"

#include <stdio.h>

PyObject *os_error(int error)
{
    errno = error;
    return PyErr_SetFromErrno(PyExc_OSError);
}

PyObject *stat_tuple(const struct stat *st)
{
    /* The mtime in ns again: through the next second when it is before 1970, since the
     * earliest (tv_sec -9223372037) times 10**9 is below INT64_MIN, a signed overflow. */
    long long seconds = st->st_mtim.tv_sec, nanoseconds = st->st_mtim.tv_nsec;
    if (seconds < 0 && nanoseconds > 0) {
        seconds += 1;
        nanoseconds -= 1000000000;
    }
    return Py_BuildValue("{s:K,s:I,s:K,s:I,s:I,s:L,s:L,s:L}", "st_ino", (unsigned long long) st->st_ino,
                         "st_mode", (unsigned) st->st_mode, "st_nlink", (unsigned long long) st->st_nlink,
                         "st_uid", (unsigned) st->st_uid, "st_gid", (unsigned) st->st_gid,
                         "st_size", (long long) st->st_size, "st_blocks", (long long) st->st_blocks,
                         "st_mtime_ns", seconds * 1000000000LL + nanoseconds);
}

/* ``count`` (start, end) pairs from a sequence of ``count`` pairs (a Python error and
 * -1 otherwise; the values are checked by tree_open). */
static int spans_from(PyObject *sequence, uint64_t (*span)[2], Py_ssize_t count, const char *what,
                      const char *wrong_count)
{
    PyObject *items = PySequence_Fast(sequence, what);
    if (items == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(items) != count) {
        Py_DECREF(items);
        PyErr_SetString(PyExc_ValueError, wrong_count);
        return -1;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        unsigned long long start, end;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, k), "KK", &start, &end)) {
            Py_DECREF(items);
            return -1;
        }
        span[k][0] = start;
        span[k][1] = end;
    }
    Py_DECREF(items);
    return 0;
}

/* Format 1.4's page checks (Archive.page_checks: page_size, the regions' (start, end),
 * their page CRCs as bytes, and data_end); ``crcs`` holds the CRCs' buffer. */
static int pages_from(TreeSpans *spans, PyObject *pages, Py_buffer *crcs, unsigned paged_regions)
{
    unsigned long long page_size, data_end;
    PyObject *regions;
    if (!PyArg_ParseTuple(pages, "KOy*K", &page_size, &regions, crcs, &data_end))
        return -1;
    spans->has_pages = 1;
    spans->page_size = page_size;
    spans->data_end = data_end;
    spans->page_crcs = crcs->buf;
    spans->page_crc_bytes = (uint64_t) crcs->len;
    Py_ssize_t count = PySequence_Length(regions);
    if (count < 0)
        return -1;
    if (count != (Py_ssize_t) paged_regions) {  /* tree_open says so */
        spans->region_count = (unsigned) (count < PAGED_REGIONS_CODECS ? count : PAGED_REGIONS_CODECS + 1);
        return 0;
    }
    spans->region_count = paged_regions;
    return spans_from(regions, spans->regions, count, "pages: the regions, a sequence of (start, end)",
                      "pages: the page size or the number of regions is wrong");
}

int tree_open_from_python(TreeObject *o, PyObject *args, PyObject *kwargs, const char *type_name)
{
    Tree *t = &o->tree;
    Py_buffer *map = &o->map;
    int *have_map = &o->have_map;
    static char *keywords[] = {"mapping", "fd", "guard", "records", "data_records", "entries", "sections",
                               "check_once", "name", "log_fd", "pieces", "xattrs", "pages", "codecs",
                               "check_always", "checked_bits", "failed_bits", NULL};
    PyObject *mapping, *sections, *pieces = Py_None, *xattrs = Py_None, *pages = Py_None, *codecs = Py_None;
    PyObject *checked_bits = Py_None, *failed_bits = Py_None;
    TreeSpans spans;
    memset(&spans, 0, sizeof spans);
    spans.name = "archive";
    spans.log_fd = 2;
    unsigned long long records, data_records, entries;
    char format[64];
    if (*have_map || o->have_bits) {
        PyErr_SetString(PyExc_TypeError, "a Tree is initialised once");
        return -1;
    }
    snprintf(format, sizeof format, "OiiKKKOp|siOOOOpOO:%s", type_name);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, keywords, &mapping, &spans.fd, &spans.guard, &records,
                                     &data_records, &entries, &sections, &spans.check_once, &spans.name,
                                     &spans.log_fd, &pieces, &xattrs, &pages, &codecs, &spans.check_always,
                                     &checked_bits, &failed_bits))
        return -1;
    if ((checked_bits == Py_None) != (failed_bits == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "checked_bits and failed_bits: both, or neither");
        return -1;
    }
    if (PyObject_GetBuffer(mapping, map, PyBUF_SIMPLE) != 0)
        return -1;
    *have_map = 1;
    spans.base = map->buf;
    spans.size = (uint64_t) map->len;
    spans.records = records;
    spans.data_records = data_records;
    spans.entries = entries;
    if (checked_bits != Py_None) {
        /* The policy's bytearrays, held (so never resized or freed) until dealloc; a bit
         * per data record, as tree_open's own would be. */
        if (PyObject_GetBuffer(checked_bits, &o->checked_bits, PyBUF_WRITABLE) != 0)
            return -1;
        if (PyObject_GetBuffer(failed_bits, &o->failed_bits, PyBUF_WRITABLE) != 0) {
            PyBuffer_Release(&o->checked_bits);
            return -1;
        }
        o->have_bits = 1;
        uint64_t needed = (data_records + 7) / 8;
        if ((uint64_t) o->checked_bits.len < needed || (uint64_t) o->failed_bits.len < needed) {
            PyErr_SetString(PyExc_ValueError, "checked_bits and failed_bits: a bit per data record");
            return -1;
        }
        spans.shared_checked = o->checked_bits.buf;
        spans.shared_failed = o->failed_bits.buf;
    }
    if (spans.guard >= 0) {
        PackfsSigbusAPI *api = PyCapsule_Import(PACKFS_SIGBUS_CAPSULE, 0);
        if (api == NULL)
            return -1;
        spans.guard_check = api->check;
    }
    if (spans_from(sections, spans.sections, SECTIONS, "sections: a sequence of (start, end)",
                   "expected 15 sections") != 0)
        return -1;
    spans.has_pieces = pieces != Py_None;
    if (spans.has_pieces && spans_from(pieces, spans.pieces, 3, "pieces: three (start, end)",
                                             "pieces: expected three spans") != 0)
        return -1;
    spans.has_xattrs = xattrs != Py_None;
    if (spans.has_xattrs && spans_from(xattrs, spans.xattrs, 3, "xattrs: three (start, end)",
                                             "xattrs: expected three spans") != 0)
        return -1;
    spans.has_codecs = codecs != Py_None;
    if (spans.has_codecs && spans_from(codecs, spans.codecs, 2, "codecs: two (start, end)",
                                             "codecs: expected two spans") != 0)
        return -1;
    Py_buffer crcs = {0};
    if (pages != Py_None
        && pages_from(&spans, pages, &crcs, spans.has_codecs ? PAGED_REGIONS_CODECS : PAGED_REGIONS) != 0) {
        if (crcs.obj != NULL)
            PyBuffer_Release(&crcs);
        return -1;
    }
    int error = tree_open(t, &spans);
    if (crcs.obj != NULL)
        PyBuffer_Release(&crcs);
    if (error == 0)
        return 0;
    if (error == EINVAL)
        PyErr_SetString(PyExc_ValueError, spans.error);
    else if (error == ENOMEM)
        PyErr_NoMemory();
    else
        os_error(error);
    return -1;
}

PyObject *tree_object_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    TreeObject *o = (TreeObject *) type->tp_alloc(type, 0);
    if (o != NULL) {
        tree_prepare(&o->tree);
        blockcache_prepare(&o->cache);
        o->reader = NULL;
    }
    return (PyObject *) o;
}

void tree_object_release(TreeObject *o)
{
    tree_close(&o->tree);
    blockcache_close(&o->cache);
    Py_CLEAR(o->reader);
    if (o->have_map)
        PyBuffer_Release(&o->map);
    o->have_map = 0;
    if (o->have_bits) {
        PyBuffer_Release(&o->checked_bits);
        PyBuffer_Release(&o->failed_bits);
    }
    o->have_bits = 0;
}

Tree *tree_ready(PyObject *self)
{
    Tree *t = &((TreeObject *) self)->tree;
    if (!t->initialised) {  /* also after an __init__ that failed half-way */
        PyErr_SetString(PyExc_ValueError, "the Tree is not initialised");
        return NULL;
    }
    return t;
}

/* Tree.remote_read for a remote archive: the node cache's blocks read here, without
 * the GIL; what it does not hold (or holds damaged) read by the reader, under the GIL,
 * which fetches it once per node and writes it to the cache.  Never tree_changed: a
 * failed fetch is EIO for this read alone (the reader logs it; a changed object stays
 * changed in the reader, which then fails every read). */
static int remote_read(void *context, uint8_t *buffer, uint64_t count, uint64_t at, uint64_t limit)
{
    TreeObject *o = context;
    if (blockcache_read(&o->cache, buffer, count, at) == 0)
        return 0;
    int error = EIO;
    PyGILState_STATE state = PyGILState_Ensure();
    PyObject *data = PyObject_CallFunction(o->reader, "KKK", (unsigned long long) at, (unsigned long long) count,
                                           (unsigned long long) limit);
    if (data == NULL) {
        PyErr_WriteUnraisable(o->reader);  /* a bug of the reader's: it answers None for what it expects */
    } else if (PyBytes_Check(data) && (uint64_t) PyBytes_GET_SIZE(data) == count) {
        memcpy(buffer, PyBytes_AS_STRING(data), count);
        error = 0;
    }
    Py_XDECREF(data);
    PyGILState_Release(state);
    return error;
}

int tree_object_open(TreeObject *o, PyObject *args, PyObject *kwargs, const char *type_name)
{
    PyObject *remote = NULL, *rest = NULL;
    if (kwargs != NULL) {
        remote = PyDict_GetItemString(kwargs, "remote");  /* borrowed */
        if (remote != NULL) {
            if ((rest = PyDict_Copy(kwargs)) == NULL || PyDict_DelItemString(rest, "remote") != 0) {
                Py_XDECREF(rest);
                return -1;
            }
            kwargs = rest;
        }
    }
    PyObject *reader = NULL;
    int dir_fd;
    const char *relative;
    unsigned int salt;
    unsigned long long size, from, to;
    if (remote != NULL && remote != Py_None
        && !PyArg_ParseTuple(remote, "OisIKKK:remote", &reader, &dir_fd, &relative, &salt, &size, &from, &to)) {
        Py_XDECREF(rest);
        return -1;
    }
    if (reader != NULL && !PyCallable_Check(reader)) {
        Py_XDECREF(rest);
        PyErr_SetString(PyExc_TypeError, "remote: the reader must be callable");
        return -1;
    }
    int status = tree_open_from_python(o, args, kwargs, type_name);
    Py_XDECREF(rest);
    if (status != 0 || reader == NULL)
        return status;
    Tree *t = &o->tree;
    if (from > to || to > t->file_size || size != t->file_size) {
        PyErr_SetString(PyExc_ValueError, "remote: the data area or the size is not the archive's");
        return -1;
    }
    if (dir_fd >= 0) {
        int error = blockcache_open(&o->cache, dir_fd, relative, (uint32_t) salt, size);
        if (error == EINVAL) {
            PyErr_SetString(PyExc_ValueError, "remote: the cache's directory name breaks the layout's rules");
            return -1;
        }
        if (error != 0) {
            os_error(error);
            return -1;
        }
    }
    Py_INCREF(reader);
    o->reader = reader;
    t->remote_context = o;
    t->remote_from = from;
    t->remote_to = to;
    t->remote_read = remote_read;
    return 0;
}

PyObject *tree_remote_counts(TreeObject *o)
{
    return Py_BuildValue("{s:K,s:K}", "cache_hits", (unsigned long long) o->cache.hits, "cache_misses",
                         (unsigned long long) o->cache.misses);
}
