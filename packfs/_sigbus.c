/* packfs._sigbus: survive an archive being truncated under its memory map.
 *
 * Touching a mapped page that lies past the file's current end is SIGBUS, whose
 * default action kills the process.  `cp new.ffr data.ffr` (open with O_TRUNC, then
 * write) does exactly that to every process reading data.ffr through a map.
 *
 * register(buffer, fd) records a map's address range and the file's identity (device,
 * inode, size, mtime: not ctime, which unlink, rename over, chmod and link change too,
 * while the contents stay what they were).  The SIGBUS handler, for a fault (BUS_ADRERR) inside a
 * registered range, first bumps that range's fault counter and then maps anonymous
 * zero pages over the whole range (MAP_FIXED), so the faulting instruction and every
 * later access read zeros instead of faulting.  Any other SIGBUS goes to the handler
 * that was installed before ours (faulthandler's, torch's) or to the default action.
 * check(slot) is what callers run after each operation that read the map: 0 if the
 * range never faulted and fstat() still shows the identity registered; otherwise a
 * reason code, which then sticks (the map holds zeros, or the file is another one).
 *
 * Python never indexes with a value read from the map without checking it first, so
 * zeros read before check() runs cannot take a read out of bounds.
 *
 * The handler only reads the slot table, bumps a counter and calls mmap(2) (a plain
 * system call), sigaction(2) and raise(3): no locks, no allocation.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "_sigbus.h"

/* Maps open at once (RecordReader keeps one per shard); beyond this, register()
 * returns -1 and the caller falls back to its pure-Python checks. */
#define CAPACITY 32768

enum { UNCHANGED = 0, FAULTED = 1, REPLACED = 2, STAT_FAILED = 3 };

typedef struct {
    uintptr_t base;           /* written before active is set (release) */
    size_t length;
    int active;               /* read by the handler (acquire) */
    unsigned long faults;     /* bumped by the handler */
    int fd;
    int changed;              /* sticky reason, once check() saw one */
    int stale;                /* deactivated by a register() over its addresses */
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} Slot;

static Slot slots[CAPACITY];
static int free_slots[CAPACITY];
static int free_count;
static int high_water;        /* every active slot is below it */
static struct sigaction previous;
/* Set once a real fault (si_code > 0) that is not ours went to the previous handler:
 * the process is going down, and if a SIGBUS comes back (faulthandler restores our
 * handler and raises again; the faulting access runs again), the default action ends
 * it, with no loop.  For a SIGBUS someone sent (kill), which a handler can survive (a
 * Python handler), it is set only while that handler runs, so the next one reaches it
 * too. */
static volatile sig_atomic_t chained;
static int recheck;           /* checks left that re-install the handler first */
static unsigned checks;

static void after_fork_in_child(void)
{
    recheck = 1024;
}

static void to_default(int signal_number, siginfo_t *info)
{
    struct sigaction fallback;
    memset(&fallback, 0, sizeof fallback);
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    sigaction(signal_number, &fallback, NULL);
    /* A fault repeats when the handler returns and now kills; a signal someone sent
     * (si_code <= 0) would not repeat, so send it again. */
    if (info == NULL || info->si_code <= 0)
        raise(signal_number);
}

static void on_sigbus(int signal_number, siginfo_t *info, void *context)
{
    int saved_errno = errno;
    if (info != NULL && info->si_code == BUS_ADRERR) {
        uintptr_t address = (uintptr_t) info->si_addr;
        int top = __atomic_load_n(&high_water, __ATOMIC_ACQUIRE);
        for (int i = 0; i < top; i++) {
            Slot *slot = &slots[i];
            if (!__atomic_load_n(&slot->active, __ATOMIC_ACQUIRE))
                continue;
            if (address - slot->base >= slot->length)  /* unsigned: also address < base */
                continue;
            /* Counter first: a thread that reads the zeros below then sees it. */
            __atomic_add_fetch(&slot->faults, 1, __ATOMIC_SEQ_CST);
            void *mapped = mmap((void *) slot->base, slot->length, PROT_READ,
                                MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (mapped != MAP_FAILED) {
                errno = saved_errno;
                return;  /* the faulting access runs again and reads a zero */
            }
            break;  /* cannot repair it: die as before */
        }
    }
    if (chained) {
        to_default(signal_number, info);
        errno = saved_errno;
        return;
    }
    int sent = info == NULL || info->si_code <= 0;
    chained = 1;
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction != NULL)
            previous.sa_sigaction(signal_number, info, context);
        else
            to_default(signal_number, info);
    } else if (previous.sa_handler == SIG_IGN && info != NULL && info->si_code <= 0) {
        /* a sent SIGBUS that was ignored before us stays ignored */
    } else if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
        to_default(signal_number, info);
    } else {
        previous.sa_handler(signal_number);
    }
    if (sent)
        chained = 0;
    errno = saved_errno;
}

/* Put our handler in front, keeping whatever was there as the one to chain to.  Run
 * at every register(): a handler installed after ours (faulthandler.enable(), torch's
 * DataLoader workers) is then chained to instead of hiding ours. */
static int ensure_installed(void)
{
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0)
        return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus)
        return 0;
    struct sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_sigbus;
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&ours.sa_mask);
    /* The handler may run between these two calls and would then chain to the old
     * "previous"; both are valid handlers, so either outcome is sound. */
    previous = current;
    if (sigaction(SIGBUS, &ours, NULL) != 0)
        return -1;
    return 0;
}

static int identity_of(int fd, Slot *slot)
{
    struct stat info;
    if (fstat(fd, &info) != 0)
        return -1;
    slot->dev = info.st_dev;
    slot->ino = info.st_ino;
    slot->size = info.st_size;
    slot->mtime = info.st_mtim;
    return 0;
}

static Slot *slot_of(PyObject *argument)
{
    long index = PyLong_AsLong(argument);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (index < 0 || index >= high_water || !slots[index].active) {
        PyErr_Format(PyExc_ValueError, "no registered map in slot %ld", index);
        return NULL;
    }
    return &slots[index];
}

PyDoc_STRVAR(register_doc,
"register(buffer, fd) -> slot\n\n"
"Guard the map behind ``buffer`` (an mmap object) of the file open as ``fd``: a\n"
"SIGBUS inside it is survived.  -1 when every slot is taken (or the handler\n"
"cannot be installed): the caller must use its own checks then.");

static PyObject *sigbus_register(PyObject *module, PyObject *args)
{
    PyObject *object;
    int fd;
    if (!PyArg_ParseTuple(args, "Oi:register", &object, &fd))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(object, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    uintptr_t base = (uintptr_t) view.buf;
    size_t length = (size_t) view.len;
    PyBuffer_Release(&view);
    long page = sysconf(_SC_PAGESIZE);
    if (length == 0 || page <= 0 || base % (uintptr_t) page != 0) {
        PyErr_SetString(PyExc_ValueError, "expected a whole, non-empty memory map");
        return NULL;
    }
    if (ensure_installed() != 0)
        return PyLong_FromLong(-1);
    int index;
    if (free_count > 0)
        index = free_slots[--free_count];
    else if (high_water < CAPACITY)
        index = high_water;
    else
        return PyLong_FromLong(-1);
    /* An active slot over any of these addresses is stale: the kernel hands out an
     * address again only after it was unmapped, and a map can be unmapped (by the
     * garbage collector) a moment before its slot is released.  A fault there must
     * not be taken for that old map's. */
    int top = high_water;
    for (int i = 0; i < top; i++) {
        Slot *other = &slots[i];
        if (other->active && other->base < base + length && base < other->base + other->length) {
            __atomic_store_n(&other->active, 0, __ATOMIC_RELEASE);
            other->stale = 1;  /* freed when its own unregister() comes */
        }
    }
    Slot *slot = &slots[index];
    if (identity_of(fd, slot) != 0) {
        if (index < high_water)
            free_slots[free_count++] = index;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    slot->base = base;
    slot->length = length;
    slot->fd = fd;
    slot->changed = UNCHANGED;
    slot->stale = 0;
    __atomic_store_n(&slot->faults, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&slot->active, 1, __ATOMIC_RELEASE);
    if (index == high_water)
        __atomic_store_n(&high_water, index + 1, __ATOMIC_RELEASE);
    return PyLong_FromLong(index);
}

PyDoc_STRVAR(unregister_doc,
"unregister(slot)\n\nStop guarding the map in ``slot``; call it before the map is unmapped.");

static PyObject *sigbus_unregister(PyObject *module, PyObject *argument)
{
    long index = PyLong_AsLong(argument);
    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (index >= 0 && index < high_water && slots[index].stale) {
        slots[index].stale = 0;
        free_slots[free_count++] = (int) index;
        Py_RETURN_NONE;
    }
    Slot *slot = slot_of(argument);
    if (slot == NULL)
        return NULL;
    __atomic_store_n(&slot->active, 0, __ATOMIC_RELEASE);
    free_slots[free_count++] = (int) (slot - slots);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(check_doc,
"check(slot) -> int\n\n"
"0 while the map never faulted and fstat() of its file descriptor shows the same\n"
"device, inode, size and mtime as at register(); otherwise 1 (it faulted),\n"
"2 (the file was changed or replaced) or 3 (fstat failed), and then always that.");

/* check() without Python, for compiled readers (packfs._lowlevel's daemon threads,
 * which hold no GIL): exported through the capsule packfs._sigbus._C_API.  The slot
 * must be one register() returned and that is still registered. */
static int check_slot(int index)
{
    if (index < 0 || index >= CAPACITY)
        return STAT_FAILED;
    Slot *slot = &slots[index];
    /* A handler installed after ours hides it until we are back in front: look every
     * 256 checks, and at each of the first ones in a forked child (torch installs its
     * own in each DataLoader worker).  A sigaction() per check would cost 40%. */
    if (recheck > 0 || (++checks & 255) == 0) {
        if (recheck > 0)
            recheck--;
        ensure_installed();
    }
    if (slot->changed == UNCHANGED) {
        struct stat info;
        if (__atomic_load_n(&slot->faults, __ATOMIC_SEQ_CST))
            slot->changed = FAULTED;
        else if (fstat(slot->fd, &info) != 0)
            slot->changed = STAT_FAILED;
        else if (info.st_dev != slot->dev || info.st_ino != slot->ino || info.st_size != slot->size
                 || info.st_mtim.tv_sec != slot->mtime.tv_sec || info.st_mtim.tv_nsec != slot->mtime.tv_nsec)
            slot->changed = REPLACED;
        else if (__atomic_load_n(&slot->faults, __ATOMIC_SEQ_CST))  /* a fault during fstat */
            slot->changed = FAULTED;
    }
    return slot->changed;
}

static PyObject *sigbus_check(PyObject *module, PyObject *argument)
{
    Slot *slot = slot_of(argument);
    if (slot == NULL)
        return NULL;
    return PyLong_FromLong(check_slot((int) (slot - slots)));
}

PyDoc_STRVAR(faults_doc, "faults(slot) -> int\n\nHow many SIGBUS faults the map in ``slot`` survived.");

static PyObject *sigbus_faults(PyObject *module, PyObject *argument)
{
    Slot *slot = slot_of(argument);
    if (slot == NULL)
        return NULL;
    return PyLong_FromUnsignedLong(__atomic_load_n(&slot->faults, __ATOMIC_SEQ_CST));
}

static PyMethodDef methods[] = {
    {"register", sigbus_register, METH_VARARGS, register_doc},
    {"unregister", sigbus_unregister, METH_O, unregister_doc},
    {"check", sigbus_check, METH_O, check_doc},
    {"faults", sigbus_faults, METH_O, faults_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "packfs._sigbus",
    "Survive SIGBUS from archives truncated under their memory map (see _sigbus.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sigbus(void)
{
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL)
        return NULL;
    if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
        Py_DECREF(module);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (PyModule_AddIntConstant(module, "UNCHANGED", UNCHANGED) || PyModule_AddIntConstant(module, "FAULTED", FAULTED)
        || PyModule_AddIntConstant(module, "REPLACED", REPLACED)
        || PyModule_AddIntConstant(module, "STAT_FAILED", STAT_FAILED)
        || PyModule_AddIntConstant(module, "CAPACITY", CAPACITY)) {
        Py_DECREF(module);
        return NULL;
    }
    static const PackfsSigbusAPI api = {check_slot};
    PyObject *capsule = PyCapsule_New((void *) &api, PACKFS_SIGBUS_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(module, "_C_API", capsule) != 0) {
        Py_XDECREF(capsule);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
