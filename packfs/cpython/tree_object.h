/* tree_object.c: a format library Tree held by a Python object (packfs._lowlevel.Tree
 * and packfs.core._format.Tree), opened from the arguments packfs.core hands it. */

#ifndef PACKFS_CPYTHON_TREE_OBJECT_H
#define PACKFS_CPYTHON_TREE_OBJECT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../cformat/blockcache.h"
#include "../cformat/table.h"

/* The object: the Tree over the map it holds. */
typedef struct {
    PyObject_HEAD
    Py_buffer map;                 /* the whole archive, mapped by packfs.source.LocalFile */
    int have_map;
    Py_buffer checked_bits, failed_bits;  /* a "once" policy's bitmaps, shared (TreeSpans.shared_checked) */
    int have_bits;
    Tree tree;
    /* A remote archive (the constructor's ``remote``): the node cache C reads itself,
     * and the callable that reads what it does not hold (reader(at, count, limit) ->
     * bytes, or None: EIO, said in the log by the reader; limit 0 or the end of the
     * file read, past which nothing is fetched ahead). */
    BlockCache cache;
    PyObject *reader;
} TreeObject;

/* tp_new: a Tree that owns nothing yet. */
PyObject *tree_object_new(PyTypeObject *type, PyObject *args, PyObject *kwargs);
/* What tp_dealloc frees (then tp_free): the Tree's memory, descriptor and map. */
void tree_object_release(TreeObject *o);
/* The Tree of an initialised Tree object, or NULL with ValueError. */
Tree *tree_ready(PyObject *self);

/* Open ``o``'s Tree (prepared) from a Tree constructor's ``args`` and ``kwargs``: its
 * ``map`` receives the archive's buffer (have_map 1 once it must be released), and
 * checked_bits and failed_bits a "once" policy's bitmaps when given (have_bits).  0, or
 * -1 with a Python error (ValueError for spans that break a rule). */
int tree_open_from_python(TreeObject *o, PyObject *args, PyObject *kwargs, const char *type_name);
/* tree_open_from_python for a Tree object, with its ``remote`` keyword: (reader, the
 * cache's directory descriptor or -1, the archive's directory below it, the CRC salt,
 * the archive's size, and the data area's (start, end)), or None. */
int tree_object_open(TreeObject *o, PyObject *args, PyObject *kwargs, const char *type_name);
/* A remote Tree's counts: {"cache_hits": blocks C read from the cache, "cache_misses":
 * reads it handed to the reader}. */
PyObject *tree_remote_counts(TreeObject *o);
/* OSError with ``error`` as its errno. */
PyObject *os_error(int error);
/* An entry's attributes as a dict of st_* (os.stat_result's names). */
PyObject *stat_tuple(const struct stat *st);

#endif
