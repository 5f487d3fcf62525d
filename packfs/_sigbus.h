/* What packfs._sigbus offers compiled code, through the capsule PACKFS_SIGBUS_CAPSULE
 * (PyCapsule_Import it with the GIL held, then call without it). */
#ifndef PACKFS_SIGBUS_H
#define PACKFS_SIGBUS_H

#define PACKFS_SIGBUS_CAPSULE "packfs._sigbus._C_API"

typedef struct {
    /* check(slot): 0 while the map registered in ``slot`` never faulted and its file
     * shows the identity it had at register(); otherwise the sticky reason (1 faulted,
     * 2 changed or replaced, 3 fstat failed).  Safe from any thread, without the GIL. */
    int (*check)(int slot);
} PackfsSigbusAPI;

#endif
