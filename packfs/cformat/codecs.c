/* Decoding format 1.5's codecs (section 4f) with libzstd: one zstd frame (with a
 * dictionary, loaded once into a DDict every thread shares), the frames a read covers
 * (each checked before and after it is decoded, decoded into exactly its size), or a
 * sparse file's extents over zeros; decoded small files and frames are kept (16 for the
 * process).  Each thread has its own ZSTD_DCtx.  Built without libzstd
 * (PACKFS_NO_ZSTD), tree_open refuses archives with codecs.
 *
 * Bytes read: a record's codec row (section 22), its frame table or extent list in
 * codec_data (section 23), each checked against its rules before use, and the stored
 * frames in the data area with pread, each against its stored and decoded CRC.
 */

#include "codecs.h"

#include "crc.h"

#include "records.h"
#include "table.h"

#include <stdlib.h>
#include <unistd.h>
#ifndef PACKFS_NO_ZSTD
#include <zstd.h>
#endif

/* -- codecs (format section 4f) ------------------------------------------------------------ */

/* A decoded small file or frame, kept for the READs that follow (DECODED_SLOTS). */
typedef struct {
    const Tree *tree;              /* whose record (slots are shared by every Tree) */
    uint64_t record, index, length; /* index: the frame (0 for a one-frame file) */
    uint64_t used;                 /* 0: empty; else when last used (the oldest goes first) */
    uint8_t *bytes;
} Decoded;

static Decoded decoded_slots[DECODED_SLOTS];
static pthread_mutex_t decoded_lock = PTHREAD_MUTEX_INITIALIZER;
/* Every Tree's dictionaries (made at first use): one lock, held only for memory work. */
static pthread_mutex_t dictionaries_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t decoded_clock;

static inline int decoded_is(const Decoded *d, const Tree *t, uint64_t record, uint64_t index, uint64_t length)
{
    return d->used && d->tree == t && d->record == record && d->index == index && d->length == length;
}

/* Copy [from, from + count) of the decoded bytes of (record, index), ``length`` bytes
 * in all, into ``into`` if they are kept: 1, else 0. */
static int decoded_copy(Tree *t, uint64_t record, uint64_t index, uint64_t length, uint64_t from, uint64_t count,
                        uint8_t *into)
{
    int found = 0;
    pthread_mutex_lock(&decoded_lock);
    for (unsigned k = 0; k < DECODED_SLOTS; k++) {
        Decoded *d = &decoded_slots[k];
        if (decoded_is(d, t, record, index, length)) {
            memcpy(into, d->bytes + from, (size_t) count);
            d->used = ++decoded_clock;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&decoded_lock);
    return found;
}

/* Keep ``bytes`` (malloc'ed, ``length`` of them: taken over) as (record, index)'s,
 * in place of the slot used longest ago. */
static void keep_decoded(Tree *t, uint64_t record, uint64_t index, uint8_t *bytes, uint64_t length)
{
    pthread_mutex_lock(&decoded_lock);
    Decoded *oldest = &decoded_slots[0];
    for (unsigned k = 0; k < DECODED_SLOTS; k++) {
        Decoded *d = &decoded_slots[k];
        if (decoded_is(d, t, record, index, length)) {
            oldest = NULL;  /* another thread decoded it meanwhile */
            break;
        }
        if (d->used < oldest->used)
            oldest = d;
    }
    if (oldest != NULL) {
        free(oldest->bytes);
        *oldest = (Decoded) {t, record, index, length, ++decoded_clock, bytes};
        bytes = NULL;
    }
    pthread_mutex_unlock(&decoded_lock);
    free(bytes);
}

/* A fork (a DataLoader's workers, after a thread read through read_file) must not leave
 * the child a lock another thread held: the forking thread holds both across the fork
 * (neither is ever held while waiting for anything but memory work). */
void decoded_before_fork(void)
{
    pthread_mutex_lock(&decoded_lock);
    pthread_mutex_lock(&dictionaries_lock);
}

void decoded_after_fork(void)
{
    pthread_mutex_unlock(&dictionaries_lock);
    pthread_mutex_unlock(&decoded_lock);
}

/* Tree ``t`` goes: its kept bytes too (a later Tree at the same address must not find them). */
void forget_decoded(const Tree *t)
{
    pthread_mutex_lock(&decoded_lock);
    for (unsigned k = 0; k < DECODED_SLOTS; k++) {
        if (decoded_slots[k].used && decoded_slots[k].tree == t) {
            free(decoded_slots[k].bytes);
            memset(&decoded_slots[k], 0, sizeof decoded_slots[k]);
        }
    }
    pthread_mutex_unlock(&decoded_lock);
}

#ifndef PACKFS_NO_ZSTD
/* A zstd dictionary record, made into a ZSTD_DDict at its first use (then shared by
 * every thread: a DDict is read-only). */
typedef struct Dictionary {
    uint64_t record;
    ZSTD_DDict *ddict;
} Dictionary;

/* One ZSTD_DCtx per thread (libfuse's workers, and callers of the Python methods),
 * freed when the thread ends. */
static pthread_key_t dctx_key;
static pthread_once_t dctx_once = PTHREAD_ONCE_INIT;

static void free_dctx(void *dctx)
{
    ZSTD_freeDCtx(dctx);
}

static void make_dctx_key(void)
{
    pthread_key_create(&dctx_key, free_dctx);
}

static ZSTD_DCtx *thread_dctx(void)
{
    pthread_once(&dctx_once, make_dctx_key);
    ZSTD_DCtx *dctx = pthread_getspecific(dctx_key);
    if (dctx == NULL && (dctx = ZSTD_createDCtx()) != NULL)
        pthread_setspecific(dctx_key, dctx);
    return dctx;
}

/* Where ``record`` is, or goes, in t's dictionaries (ascending by record); under
 * dictionaries_lock. */
static uint64_t dictionary_slot(const Tree *t, uint64_t record)
{
    uint64_t low = 0, high = t->dictionary_count;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (t->dictionaries[middle].record < record)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

/* Dictionary record ``record`` (its row checked to be CODEC_DICTIONARY by the caller)
 * as a DDict in *ddict: made once, from its bytes checked against its record CRC.
 * dictionaries_lock is held only to look and to insert, never while the record is read
 * (a URL tree's read may wait for the GIL) or the DDict made: so the fork handlers can
 * take it (a child never inherits it held), and no tree waits on another's reads. */
static int dictionary_of(Tree *t, uint64_t entry, uint64_t record, ZSTD_DDict **ddict)
{
    pthread_mutex_lock(&dictionaries_lock);
    uint64_t slot = dictionary_slot(t, record);
    int found = slot < t->dictionary_count && t->dictionaries[slot].record == record;
    if (found)
        *ddict = t->dictionaries[slot].ddict;
    pthread_mutex_unlock(&dictionaries_lock);
    if (found)
        return 0;
    uint64_t start = offset_of(t, record), end = offset_of(t, record + 1);
    if (page_failure)
        return EIO;
    if (start < t->header_end || start > end || end > t->data_end || end - start > DICTIONARY_MAX)
        return codec_broken(t, entry, 41, "names a zstd dictionary outside the data area or over 1 MiB");
    uint8_t *bytes = NULL;
    size_t skip = 0;
    int error = read_stored(t, entry, record, start, end, 0, end - start, &bytes, &skip, NULL);
    if (error)
        return error;
    ZSTD_DDict *made = ZSTD_createDDict(bytes + skip, (size_t) (end - start));
    free(bytes);
    if (made == NULL)
        return codec_broken(t, entry, 42, "names a zstd dictionary that zstd cannot load");
    pthread_mutex_lock(&dictionaries_lock);
    slot = dictionary_slot(t, record);
    if (slot < t->dictionary_count && t->dictionaries[slot].record == record) {
        /* another thread made it meanwhile: theirs is kept, every reader uses one */
        ZSTD_freeDDict(made);
        *ddict = t->dictionaries[slot].ddict;
        goto done;
    }
    if (t->dictionary_count == t->dictionary_capacity) {
        uint64_t capacity = t->dictionary_capacity ? 2 * t->dictionary_capacity : 8;
        Dictionary *grown = realloc(t->dictionaries, capacity * sizeof *grown);
        if (grown == NULL) {
            ZSTD_freeDDict(made);
            error = ENOMEM;
            goto done;
        }
        t->dictionaries = grown;
        t->dictionary_capacity = capacity;
    }
    memmove(t->dictionaries + slot + 1, t->dictionaries + slot,
            (t->dictionary_count - slot) * sizeof *t->dictionaries);
    t->dictionaries[slot] = (Dictionary) {record, made};
    t->dictionary_count++;
    *ddict = made;
done:
    pthread_mutex_unlock(&dictionaries_lock);
    return error;
}

/* ``stored`` (``stored_length`` bytes: one zstd frame, nothing after it) decoded into
 * exactly ``expected`` bytes at ``into``, with ``ddict`` or none: a frame that decodes
 * to more or fewer bytes is an error, found without decoding more than ``expected``. */
static int zstd_decode_into(Tree *t, uint64_t entry, const uint8_t *stored, uint64_t stored_length,
                            uint64_t expected, ZSTD_DDict *ddict, uint8_t *into)
{
    /* zstd would decode a second frame after the first, or skip a skippable one */
    if (ZSTD_findFrameCompressedSize(stored, (size_t) stored_length) != stored_length)
        return codec_broken(t, entry, 43, "has zstd data that is not one frame decoding to its size");
    ZSTD_DCtx *dctx = thread_dctx();
    if (dctx == NULL)
        return ENOMEM;
    size_t got = ddict != NULL ? ZSTD_decompress_usingDDict(dctx, into, (size_t) expected, stored,
                                                            (size_t) stored_length, ddict)
                               : ZSTD_decompressDCtx(dctx, into, (size_t) expected, stored, (size_t) stored_length);
    if (ZSTD_isError(got) || got != expected)
        return codec_broken(t, entry, 43, "has zstd data that is not one frame decoding to its size");
    return 0;
}

/* zstd_decode_into a new buffer, *decoded (malloc'ed). */
static int zstd_decode(Tree *t, uint64_t entry, const uint8_t *stored, uint64_t stored_length, uint64_t expected,
                       ZSTD_DDict *ddict, uint8_t **decoded)
{
    uint8_t *bytes = malloc(expected ? expected : 1);
    if (bytes == NULL)
        return ENOMEM;
    int error = zstd_decode_into(t, entry, stored, stored_length, expected, ddict, bytes);
    if (error) {
        free(bytes);
        return error;
    }
    *decoded = bytes;
    return 0;
}

/* A CODEC_ZSTD file's contents, ``size`` bytes at *decoded: its record checked as any
 * record is, decoded, and its decoded CRC (the row's check) matched. */
static int decode_file(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                       const CodecRow *row, uint8_t **decoded)
{
    ZSTD_DDict *ddict = NULL;
    int error = row->aux == NO_RECORD ? 0 : dictionary_of(t, entry, row->aux, &ddict);
    uint8_t *stored = NULL;
    size_t skip = 0;
    if (!error)
        error = read_stored(t, entry, record, start, end, 0, end - start, &stored, &skip, NULL);
    if (!error) {
        error = zstd_decode(t, entry, stored + skip, end - start, size, ddict, decoded);
        free(stored);
    }
    if (!error && t->check_once && crc_update(0, *decoded, (size_t) size) != row->check) {
        free(*decoded);
        checksum_failure = 1;
        return codec_broken(t, entry, 44, "has zstd data whose decoded bytes do not match their CRC");
    }
    return error;
}

/* A CODEC_ZSTD file's ``size`` bytes decoded straight into ``into`` (a whole-file read:
 * nothing kept, no copy made): its stored bytes are used in the guarded map where
 * there is one (checked there as a record's, then decoded from there: a truncation
 * meanwhile reads zeros, which zstd refuses or the caller's finished() answers EIO),
 * read with pread otherwise; decoded with the thread's DCtx and the tree's DDict, the
 * decoded CRC checked. */
static int decode_file_into(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                            const CodecRow *row, uint8_t *into)
{
    ZSTD_DDict *ddict = NULL;
    int error = row->aux == NO_RECORD ? 0 : dictionary_of(t, entry, row->aux, &ddict);
    if (error)
        return error;
    uint8_t *copy = NULL;
    const uint8_t *stored = t->base + start;
    size_t skip = 0;
    if (t->guard >= 0)
        error = check_record_bytes(t, record, start, end, stored);
    else if ((error = read_stored(t, entry, record, start, end, 0, end - start, &copy, &skip, NULL)) == 0)
        stored = copy + skip;
    if (!error)
        error = zstd_decode_into(t, entry, stored, end - start, size, ddict, into);
    free(copy);
    if (!error && t->check_once && crc_update(0, into, (size_t) size) != row->check) {
        checksum_failure = 1;
        return codec_broken(t, entry, 44, "has zstd data whose decoded bytes do not match their CRC");
    }
    return error;
}

/* Frame ``k`` of a CODEC_FRAMES file (``size`` bytes, its record at [start, end)),
 * ``expected`` bytes at *decoded: its frame table row read (pages checked), its stored
 * bytes checked against stored_crc before they are decoded, decoded_crc after. */
static int decode_frame(Tree *t, uint64_t entry, uint64_t start, uint64_t end, const CodecRow *row, uint64_t k,
                        uint64_t expected, uint8_t **decoded)
{
    const uint8_t *table = t->codec_data + row->aux + FRAME_ROW * k;  /* k < count: record_of */
    uint64_t at = (uint64_t) (table - t->base);
    if (pages_ok(t, CODEC_DATA_REGION, k ? at - FRAME_ROW : at, at + FRAME_ROW))
        return EIO;
    uint64_t from = k ? u64_at(table - FRAME_ROW) : 0, to = u64_at(table);
    uint32_t stored_crc = u32_at(table + 8), decoded_crc = u32_at(table + 12);
    if (from >= to || to > end - start || to - from > stored_bound(expected))
        return codec_broken(t, entry, 45, "has a frame table whose frame is empty, outside its record or longer "
                                          "than zstd makes one");
    uint8_t *stored = malloc(to - from);
    if (stored == NULL)
        return ENOMEM;
    int error = read_exactly(t, stored, to - from, start + from);
    if (!error && t->check_once && crc_update(0, stored, (size_t) (to - from)) != stored_crc) {
        checksum_failure = 1;
        error = codec_broken(t, entry, 46, "has a frame whose stored bytes do not match their CRC");
    }
    if (!error)
        error = zstd_decode(t, entry, stored, to - from, expected, NULL, decoded);
    free(stored);
    if (!error && t->check_once && crc_update(0, *decoded, (size_t) expected) != decoded_crc) {
        free(*decoded);
        checksum_failure = 1;
        return codec_broken(t, entry, 47, "has a frame whose decoded bytes do not match their CRC");
    }
    return error;
}
#else
static int decode_file_into(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                            const CodecRow *row, uint8_t *into)
{
    return EIO;  /* never reached: tree_init refuses codecs without libzstd */
}

static int decode_file(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                       const CodecRow *row, uint8_t **decoded)
{
    return EIO;  /* never reached: tree_init refuses codecs without libzstd */
}

static int decode_frame(Tree *t, uint64_t entry, uint64_t start, uint64_t end, const CodecRow *row, uint64_t k,
                        uint64_t expected, uint8_t **decoded)
{
    return EIO;
}
#endif

/* Extent ``j`` of a sparse file's list at ``list`` (count checked by record_of), its
 * page checked: 0, or EIO. */
static inline int extent_at(Tree *t, const uint8_t *list, uint64_t j, uint64_t *offset, uint64_t *length)
{
    const uint8_t *p = list + 8 + EXTENT_ROW * j;
    uint64_t at = (uint64_t) (p - t->base);
    if (pages_ok(t, CODEC_DATA_REGION, at, at + EXTENT_ROW))
        return EIO;
    *offset = u64_at(p);
    *length = u64_at(p + 8);
    return 0;
}

/* A sparse file's extents are found by a binary search of its list (ascending), not a
 * walk from the first: a READ near the end of a file of a million extents cost 6.7
 * times one near its start.  Where an extent's bytes start in the record is the sum of
 * the lengths before it, so the first READ of the file walks the whole list once,
 * holding every extent to the rules, and keeps the record position of every
 * sparse_step-th extent (8 bytes per 64 extents; at most 1 MiB, as a decoded frame), in
 * a slot of the decoded bytes' (index SPARSE_INDEX); a READ then starts at the kept
 * position before the extent it needs and walks fewer than sparse_step extents to it,
 * checking each again. */
#define SPARSE_STEP 64
#define SPARSE_KEPT_MAX ((uint64_t) 1 << 17)
#define SPARSE_INDEX UINT64_MAX

static inline uint64_t sparse_step(uint64_t count)
{
    return count <= SPARSE_STEP * SPARSE_KEPT_MAX ? SPARSE_STEP : (count + SPARSE_KEPT_MAX - 1) / SPARSE_KEPT_MAX;
}

/* Walk the whole list of ``count`` extents, each held to the rules a read relies on
 * (non-empty, ascending, not overlapping, inside the file and its record): 0 with
 * *index (malloc'ed; NULL where there is no memory for it: reads walk then) the record
 * position of each ``step``-th extent, or an errno. */
static int sparse_index(Tree *t, uint64_t entry, const uint8_t *list, uint64_t count, uint64_t size, uint64_t length,
                        uint64_t step, uint64_t **index)
{
    uint64_t *kept = malloc((size_t) ((count + step - 1) / step) * sizeof(uint64_t) + 1);
    uint64_t stored = 0, previous_end = 0;
    for (uint64_t j = 0; j < count; j++) {
        uint64_t o, l;
        int error = extent_at(t, list, j, &o, &l);
        if (!error && (l == 0 || o < previous_end || o > size || l > size - o || l > length - stored))
            error = codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                               "the file and its record");
        if (error) {
            free(kept);
            return error;
        }
        if (kept != NULL && j % step == 0)
            kept[j / step] = stored;
        previous_end = o + l;
        stored += l;
    }
    *index = kept;
    return 0;
}

/* Bytes [offset, offset + want) of a CODEC_SPARSE file into ``into``: zeros, and the
 * extents' bytes where they are, read from its record as stored (checked as any
 * record's).  The extents the range covers are found by a binary search from the kept
 * positions (sparse_index), each used extent held to the rules again. */
static int read_sparse(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                       const CodecRow *row, uint64_t offset, uint64_t want, uint8_t *into)
{
    const uint8_t *list = t->codec_data + row->aux;
    uint64_t count = checked_u64(t, CODEC_DATA_REGION, list);
    if (page_failure)
        return EIO;
    memset(into, 0, (size_t) want);
    if (count == 0)
        return 0;
    uint64_t length = end - start, until = offset + want;
    uint64_t step = sparse_step(count), kept_bytes = (count + step - 1) / step * sizeof(uint64_t);
    /* The first extent ending after ``offset``, by the ends, which ascend in a list
     * that keeps the rules: sparse_index holds it to them whole before anything is
     * answered (a list that does not only sent the search elsewhere), and the walk
     * below checks every extent it uses again. */
    uint64_t low = 0, high = count;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2, o, l;
        if (extent_at(t, list, middle, &o, &l))
            return EIO;
        if (o > size || l > size - o)
            return codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                              "the file and its record");
        if (o + l > offset)
            high = middle;
        else
            low = middle + 1;
    }
    /* The list is held to the rules whole before anything is answered (sparse_index,
     * once while its positions are kept), a hole past the last extent too. */
    uint64_t j = low == count ? 0 : low - low % step, stored;
    if (!decoded_copy(t, record, SPARSE_INDEX, kept_bytes, (j / step) * sizeof(uint64_t), sizeof stored,
                      (uint8_t *) &stored)) {
        uint64_t *index = NULL;
        int error = sparse_index(t, entry, list, count, size, length, step, &index);
        if (error)
            return error;
        if (index == NULL) {  /* no memory to keep it: walk from the first */
            j = 0;
            stored = 0;
        } else {
            stored = index[j / step];
            keep_decoded(t, record, SPARSE_INDEX, (uint8_t *) index, kept_bytes);
        }
    }
    if (low == count)
        return 0;  /* past the last extent: a hole */
    uint64_t previous_end = 0;
    if (j > 0) {
        uint64_t o, l;
        if (extent_at(t, list, j - 1, &o, &l))
            return EIO;
        if (o > size || l > size - o)
            return codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                              "the file and its record");
        previous_end = o + l;
    }
    if (stored > length)
        return codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                          "the file and its record");
    uint64_t first = count, last = 0, stored_from = 0, stored_to = 0, first_stored = 0;
    for (; j < count; j++) {
        uint64_t o, l;
        if (extent_at(t, list, j, &o, &l))
            return EIO;
        if (l == 0 || o < previous_end || o > size || l > size - o || l > length - stored)
            return codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                              "the file and its record");
        if (o >= until)
            break;
        if (o + l > offset) {
            if (first == count) {
                first = j;
                first_stored = stored;
                stored_from = stored + (o < offset ? offset - o : 0);
            }
            last = j;
            stored_to = stored + ((o + l < until ? o + l : until) - o);
        }
        previous_end = o + l;
        stored += l;
    }
    if (first == count)
        return 0;  /* a hole */
    uint8_t *bytes = NULL;
    size_t skip = 0;
    int error = read_stored(t, entry, record, start, end, stored_from, stored_to - stored_from, &bytes, &skip, NULL);
    if (error)
        return error;
    const uint8_t *from = bytes + skip;
    uint64_t stored_at = first_stored;
    for (uint64_t k = first; k <= last; k++) {
        uint64_t o, l;
        if (extent_at(t, list, k, &o, &l))
            break;  /* checked in the walk above: not reached */
        uint64_t a = o < offset ? offset : o, b = o + l < until ? o + l : until;
        memcpy(into + (a - offset), from + (stored_at + (a - o) - stored_from), (size_t) (b - a));
        stored_at += l;
    }
    free(bytes);
    return 0;
}

/* Bytes [offset, offset + want) of a file whose record is not stored as it is
 * (section 4f), decoded: *out (malloc'ed, ``want`` bytes).  A one-frame file and each
 * frame are decoded once while kept (DECODED_SLOTS). */
int read_decoded(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                        const CodecRow *row, uint64_t offset, uint64_t want, uint8_t **out)
{
    uint8_t *buffer = malloc(want ? want : 1);
    if (buffer == NULL)
        return ENOMEM;
    int error = 0;
    if (row->codec == CODEC_SPARSE) {
        error = read_sparse(t, entry, record, start, end, size, row, offset, want, buffer);
    } else if (row->codec == CODEC_ZSTD) {
        if (!decoded_copy(t, record, 0, size, offset, want, buffer)) {
            uint8_t *decoded = NULL;
            if ((error = decode_file(t, entry, record, start, end, size, row, &decoded)) == 0) {
                __atomic_add_fetch(&t->decodes, 1, __ATOMIC_RELAXED);
                memcpy(buffer, decoded + offset, (size_t) want);
                keep_decoded(t, record, 0, decoded, size);
            }
        }
    } else {
        unsigned log2 = row->frame_log2;
        for (uint64_t k = offset >> log2; !error && k <= (offset + want - 1) >> log2; k++) {
            uint64_t frame_start = k << log2;
            uint64_t expected = size - frame_start < ((uint64_t) 1 << log2) ? size - frame_start : (uint64_t) 1 << log2;
            uint64_t a = offset > frame_start ? offset : frame_start;
            uint64_t b = offset + want < frame_start + expected ? offset + want : frame_start + expected;
            if (decoded_copy(t, record, k, expected, a - frame_start, b - a, buffer + (a - offset)))
                continue;
            uint8_t *decoded = NULL;
            if ((error = decode_frame(t, entry, start, end, row, k, expected, &decoded)) == 0) {
                __atomic_add_fetch(&t->decodes, 1, __ATOMIC_RELAXED);
                memcpy(buffer + (a - offset), decoded + (a - frame_start), (size_t) (b - a));
                keep_decoded(t, record, k, decoded, expected);
            }
        }
    }
    if (error) {
        free(buffer);
        return error;
    }
    *out = buffer;
    return 0;
}

int read_whole_file(Tree *t, const WholeFile *f, uint8_t *into)
{
    if (f->row.codec == CODEC_STORED)
        return read_record_into(t, f->record, f->start, f->end, into);
    if (f->row.codec == CODEC_ZSTD)
        return decode_file_into(t, f->entry, f->record, f->start, f->end, f->size, &f->row, into);
    if (f->size == 0)
        return 0;  /* frames or extents: none to read */
    uint8_t *decoded = NULL;
    int error = read_decoded(t, f->entry, f->record, f->start, f->end, f->size, &f->row, 0, f->size, &decoded);
    if (!error) {
        memcpy(into, decoded, (size_t) f->size);
        free(decoded);
    }
    return error;
}

void forget_dictionaries(Tree *t)
{
#ifndef PACKFS_NO_ZSTD
    for (uint64_t k = 0; k < t->dictionary_count; k++)
        ZSTD_freeDDict(t->dictionaries[k].ddict);
#endif
    free(t->dictionaries);
    t->dictionaries = NULL;
    t->dictionary_count = t->dictionary_capacity = 0;
}

int zstd_version(void)
{
#ifdef PACKFS_NO_ZSTD
    return 0;
#else
    return (int) ZSTD_versionNumber();
#endif
}
