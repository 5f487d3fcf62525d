/* Reading a file's record and checking it: its codec row, its extent in the data area,
 * its CRC (once per record, or per 1 MiB piece), and who checks it when several threads
 * read it at once.
 *
 * Bytes read: a data record's offsets in the header (format section 1), its CRC there,
 * its row in record_codec (section 4f), its piece CRCs (section 4b: piece_record,
 * piece_start, piece_crc), and the record's own bytes in the data area, with pread.
 * The checksum policy: with check_once, a record's bytes are answered only once its
 * CRC (or each piece's) matched; one that failed is EIO from then on.
 */

#include "records.h"

#include "codecs.h"
#include "crc.h"
#include "lookup.h"
#include "table.h"

#include <stdlib.h>
#include <unistd.h>

/* A broken rule of section 4f: EIO for the entry, logged once per entry and rule
 * (unless it came from a damaged page's zeros: that page was logged). */
int codec_broken(Tree *t, uint64_t entry, int rule, const char *what)
{
    if (page_failure)
        return EIO;
    log_line(t, entry * 64 + (uint64_t) rule, "'%s': entry %llu %s (format section 4f): it answers EIO", t->name,
             (unsigned long long) entry, what);
    return EIO;
}

/* Record ``record``'s codec row (named by ``entry``, for the log), its fields held to
 * their codec's rules (section 4f, "where used"); an archive without codecs: stored. */
static int codec_row_of(Tree *t, uint64_t entry, uint64_t record, CodecRow *row)
{
    memset(row, 0, sizeof *row);
    if (t->record_codec == NULL)
        return 0;
    const uint8_t *p = t->record_codec + CODEC_ROW * record;
    uint64_t at = (uint64_t) (p - t->base);
    if (pages_ok(t, RECORD_CODEC_REGION, at, at + CODEC_ROW))
        return EIO;
    row->codec = p[0];
    row->frame_log2 = p[1];
    row->check = u32_at(p + 4);
    row->aux = u64_at(p + 8);
    if (p[2] || p[3])
        return codec_broken(t, entry, 30, "names a record whose codec row has reserved bytes set");
    if (row->check && row->codec != CODEC_ZSTD)
        return codec_broken(t, entry, 30, "names a record whose codec row has a check its codec does not use");
    switch (row->codec) {
    case CODEC_STORED:
    case CODEC_DICTIONARY:
        if (row->aux)
            return codec_broken(t, entry, 30, "names a record whose codec row has an aux its codec does not use");
        return row->frame_log2 ? codec_broken(t, entry, 31, "names a record whose codec row has a frame size") : 0;
    case CODEC_ZSTD: {
        if (row->frame_log2)
            return codec_broken(t, entry, 31, "names a record whose codec row has a frame size");
        if (row->aux == NO_RECORD)
            return 0;
        if (row->aux >= t->data_records || row->aux == record)
            return codec_broken(t, entry, 32, "names a zstd record whose dictionary is not a data record");
        const uint8_t *d = t->record_codec + CODEC_ROW * row->aux;
        uint64_t d_at = (uint64_t) (d - t->base);
        if (pages_ok(t, RECORD_CODEC_REGION, d_at, d_at + CODEC_ROW))
            return EIO;
        static const uint8_t dictionary_row[CODEC_ROW] = {CODEC_DICTIONARY};
        if (memcmp(d, dictionary_row, CODEC_ROW) != 0)
            return codec_broken(t, entry, 32, "names a zstd record whose dictionary's row is not a dictionary's");
        return 0;
    }
    case CODEC_FRAMES:
        if (row->frame_log2 < FRAME_LOG2_MIN || row->frame_log2 > FRAME_LOG2_MAX)
            return codec_broken(t, entry, 31, "names a record of zstd frames whose frame size is out of range");
        if (row->aux % 8 || row->aux >= t->codec_data_size)
            return codec_broken(t, entry, 33, "names a record whose frame table is not inside section 23");
        return 0;
    case CODEC_SPARSE:
        if (row->frame_log2)
            return codec_broken(t, entry, 31, "names a record whose codec row has a frame size");
        if (row->aux % 8 || row->aux > t->codec_data_size || t->codec_data_size - row->aux < 8)
            return codec_broken(t, entry, 34, "names a record whose extent list is not inside section 23");
        return 0;
    default:
        return codec_broken(t, entry, 35, "names a record of an unknown codec");
    }
}

/* How many frames a file of ``size`` bytes in frames of 2**log2 has. */
static inline uint64_t frame_count(uint64_t size, unsigned log2)
{
    return size == 0 ? 0 : ((size - 1) >> log2) + 1;
}

/* A file's or symlink's record: below D, inside the data area, and its size what its
 * codec row allows (section 4f: the record's length when stored; at most 1 MiB for
 * one zstd frame; within what its frame table or extent list can describe), the size
 * in *size. */
int record_of(Tree *t, uint64_t entry, uint64_t *record, uint64_t *start, uint64_t *end, CodecRow *row,
                     uint64_t *size)
{
    uint64_t r = COLUMN64(t, RECORD, entry);
    if (r >= t->data_records)
        return broken(t, entry, 6, "names a record that is not a data record");
    uint64_t s = offset_of(t, r), e = offset_of(t, r + 1);
    if (s < t->header_end || s > e || e > t->data_end)
        return broken(t, entry, 7, "names a record whose offsets are outside the data area");
    uint64_t length = e - s, file_size = COLUMN64(t, SIZE, entry);
    int error = codec_row_of(t, entry, r, row);
    if (error)
        return error;
    switch (row->codec) {
    case CODEC_STORED:
        if (length != file_size)
            return broken(t, entry, 8, "has a size that is not its record's length");
        break;
    case CODEC_DICTIONARY:
        return codec_broken(t, entry, 36, "names a dictionary record as its contents");
    case CODEC_ZSTD:
        if (file_size > ZSTD_SIZE_MAX || length > stored_bound(file_size))
            return codec_broken(t, entry, 37, "is a zstd file over 1 MiB, or its record is longer than zstd "
                                              "makes one");
        break;
    case CODEC_FRAMES:
        if (file_size > (uint64_t) INT64_MAX
            || frame_count(file_size, row->frame_log2) > (t->codec_data_size - row->aux) / FRAME_ROW)
            return codec_broken(t, entry, 38, "has a size its frame table does not fit in section 23");
        break;
    case CODEC_SPARSE: {
        const uint8_t *list = t->codec_data + row->aux;
        uint64_t count = checked_u64(t, CODEC_DATA_REGION, list);
        if (page_failure)
            return EIO;
        /* each extent holds at least a byte of the record */
        if (file_size > (uint64_t) INT64_MAX || count > (t->codec_data_size - row->aux - 8) / EXTENT_ROW
            || count > length)
            return codec_broken(t, entry, 39, "has a size over 2**63 - 1, or an extent list not inside section 23 "
                                              "or with more extents than its record has bytes");
        break;
    }
    }
    *record = r;
    *start = s;
    *end = e;
    *size = file_size;
    return 0;
}

/* A file's or symlink's record (record_of), and for a symlink the target's own rule:
 * 1 to 4,095 bytes, stored.  What a size must obey before READ, READLINK or the kernel
 * gets it. */
int contents_of(Tree *t, uint64_t entry, unsigned type, uint64_t *record, uint64_t *start, uint64_t *end)
{
    CodecRow row;
    uint64_t size;
    int error = record_of(t, entry, record, start, end, &row, &size);
    if (!error && type == S_IFLNK && row.codec != CODEC_STORED)
        return codec_broken(t, entry, 40, "is a symlink whose target is not stored");
    if (!error && type == S_IFLNK && (*end == *start || *end - *start > MAX_SYMLINK_TARGET))
        return broken(t, entry, 11, "is a symlink whose target is empty or longer than 4095 bytes");
    return error;
}

int inode_of(Tree *t, uint64_t entry, unsigned type, uint64_t *inode)
{
    *inode = entry + 1;
    if (type != S_IFREG)
        return 0;
    uint64_t first = COLUMN32(t, FIRST_LINK, entry);
    if (first == 0)
        return 0;
    if (first > entry || (COLUMN32(t, MODE, first) & S_IFMT) != S_IFREG
        || COLUMN64(t, RECORD, first) != COLUMN64(t, RECORD, entry))
        return broken(t, entry, 9, "has a first_link that is not an earlier name of the same file");
    *inode = first + 1;
    return 0;
}


/* ``count`` bytes at ``at`` into ``buffer``, or EIO (noting the change) when fewer are
 * there: the file is shorter than at open.  A remote archive's data area is read by
 * its remote_read (the node's disk cache, else the server). */
__thread uint64_t remote_limit;

int read_exactly(Tree *t, uint8_t *buffer, uint64_t count, uint64_t at)
{
    if (t->remote_read != NULL && count > 0 && at < t->remote_to && at + count > t->remote_from)
        return t->remote_read(t->remote_context, buffer, count, at, remote_limit >= at + count ? remote_limit : 0);
    for (uint64_t done = 0; done < count;) {
        ssize_t n = pread(t->fd, buffer + done, count - done, (off_t) (at + done));
        if (n <= 0) {
            tree_changed(t);
            return EIO;
        }
        done += (uint64_t) n;
    }
    return 0;
}

/* Record ``record``'s CRC (format section 1) against ``crc``: 0, or EIO for a mismatch,
 * remembered (and logged once) unless the archive changed in place, which answers EIO
 * for everything anyway. */
static int record_crc_result(Tree *t, uint64_t record, uint32_t crc)
{
    const uint8_t *stored = t->base + 12 + 4 * record;
    if (pages_ok(t, HEADER_CRCS, 12 + 4 * record, 16 + 4 * record))
        return EIO;  /* the stored CRC is on a damaged page (logged): no verdict on the record */
    if ((uint32_t) crc == u32_at(stored)) {
        if (!t->check_always)
            set_bit(t->checked, record);
        return 0;
    }
    if (!tree_changed(t)) {
        log_line(t, ((uint64_t) 1 << 62) + record, "'%s': record %llu: checksum mismatch (the archive is "
                 "damaged): its files answer EIO", t->name, (unsigned long long) record);
        set_bit(t->failed, record);
    }
    return checksum_eio();
}

/* Claim the check of record ``record`` from the archive, or wait while another thread
 * has it (a READ, ``park``, is parked instead of waiting: see PARKED): 1 if claimed, 0
 * if the table of claims is full (then check unclaimed), -1 if it ended while waiting
 * (checked or failed), PARKED.  Only readers of the same record wait: a check takes no
 * lock that readers of other records need. */
static int claim_check(Tree *t, uint64_t record, const Parked *park)
{
    pthread_mutex_lock(&t->checks_lock);
    int claimed = -1;
    while (!record_checked(t, record) && !record_failed(t, record)) {
        unsigned k = 0;
        while (k < t->claimed_count && t->claimed[k] != record)
            k++;
        if (k == t->claimed_count) {
            claimed = t->claimed_count < MAX_CLAIMED_CHECKS;
            if (claimed) {
                t->claimed[k] = record;
                t->parked[k] = NULL;
                t->claimed_count++;
            }
            while (claimed && t->hold_checks)
                pthread_cond_wait(&t->check_ended, &t->checks_lock);
            break;
        }
        Parked *parked = park != NULL ? malloc(sizeof *parked) : NULL;
        if (parked != NULL) {
            *parked = *park;
            parked->next = t->parked[k];
            t->parked[k] = parked;
            t->parked_count++;
            claimed = PARKED;
            break;
        }
        pthread_cond_wait(&t->check_ended, &t->checks_lock);
    }
    pthread_mutex_unlock(&t->checks_lock);
    return claimed;
}

/* End the claim on ``record``: the READs parked on it, to be answered by the caller. */
static Parked *end_claim(Tree *t, uint64_t record)
{
    Parked *parked = NULL;
    pthread_mutex_lock(&t->checks_lock);
    for (unsigned k = 0; k < t->claimed_count; k++) {
        if (t->claimed[k] == record) {
            parked = t->parked[k];
            for (Parked *p = parked; p != NULL; p = p->next)
                t->parked_count--;
            t->claimed_count--;
            t->claimed[k] = t->claimed[t->claimed_count];
            t->parked[k] = t->parked[t->claimed_count];
            break;
        }
    }
    pthread_cond_broadcast(&t->check_ended);
    pthread_mutex_unlock(&t->checks_lock);
    return parked;
}


/* Answer the READs parked on record ``record``'s check, which ended with ``error``:
 * served (or EIO) as any READ of a checked (or failed) record is, so none parks again;
 * a check that ended without a verdict (a short read, no memory) answers its error. */
static void answer_parked(Tree *t, Parked *parked, uint64_t record, int error)
{
    while (parked != NULL) {
        Parked *next = parked->next;
        if (record_checked(t, record) || record_failed(t, record))
            parked->answer(t, parked, 0);
        else
            parked->answer(t, parked, finished(t, error ? error : EIO));
        free(parked);
        parked = next;
    }
}

/* Check record ``record`` once (the bitmaps: a record that matched is not checked
 * again, one that failed is EIO at once).  ``data`` is the whole record when the caller
 * already read it; else it is read here in MAX_REQUEST pieces, by one thread at a time
 * per record (claim_check; a READ ``park`` is parked meanwhile: PARKED).  0, or EIO
 * for a mismatch or a short read. */
static int check_record(Tree *t, uint64_t record, uint64_t start, uint64_t end, const uint8_t *data,
                        const Parked *park)
{
    if (record_checked(t, record))
        return 0;
    if (record_failed(t, record))
        return checksum_eio();
    uint32_t crc = 0;
    if (data != NULL)
        return record_crc_result(t, record, crc_update(0, data, (size_t) (end - start)));
    int claimed = claim_check(t, record, park);
    if (claimed == PARKED)
        return PARKED;
    if (claimed < 0)
        return record_failed(t, record) ? checksum_eio() : 0;
    int error = 0;
    uint8_t *buffer = malloc(MAX_REQUEST);
    if (buffer == NULL)
        error = ENOMEM;
    for (uint64_t at = start; !error && at < end;) {
        size_t piece = end - at < MAX_REQUEST ? (size_t) (end - at) : MAX_REQUEST;
        if ((error = read_exactly(t, buffer, piece, at)) == 0)
            crc = crc_update(crc, buffer, piece);
        at += piece;
    }
    free(buffer);
    if (!error)
        error = record_crc_result(t, record, crc);
    if (claimed)
        answer_parked(t, end_claim(t, record), record, error);
    return error;
}

/* The index of record ``record``'s first piece CRC (the record is ``length`` bytes), in
 * *first, or NO_PIECES if it has none (short, not listed, or a 1.1 archive): a binary
 * search of piece_record, its piece_start values checked as section 5 says.  ``entry``
 * names the file in the log. */
int pieces_of(Tree *t, uint64_t entry, uint64_t record, uint64_t length, uint64_t *first)
{
    *first = NO_PIECES;
    if (length <= PIECE_SIZE || t->piece_records == 0)
        return 0;
    uint64_t low = 0, high = t->piece_records;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (checked_u64(t, PIECE_REGION(0), t->piece_record + 8 * middle) < record)
            low = middle + 1;
        else
            high = middle;
    }
    uint64_t listed = low == t->piece_records ? UINT64_MAX : checked_u64(t, PIECE_REGION(0), t->piece_record + 8 * low);
    /* A damaged page's zeros say nothing about whether the record is listed: taken for
     * "not listed", its whole-record check would be remembered and its piece CRCs never
     * checked again. */
    if (page_failure)
        return EIO;
    if (listed != record)
        return 0;  /* not listed: checked whole, as in 1.1 */
    uint64_t from = checked_u64(t, PIECE_REGION(1), t->piece_start + 8 * low);
    uint64_t to = checked_u64(t, PIECE_REGION(1), t->piece_start + 8 * (low + 1));
    if (page_failure)
        return EIO;
    if (from > to || to > t->piece_total || to - from != (length + PIECE_SIZE - 1) / PIECE_SIZE)
        return broken(t, entry, 13, "has a record whose piece CRCs do not match its length");
    *first = from;
    return 0;
}

/* Bytes [offset, offset + want) of a record at ``start`` (``length`` bytes) whose piece
 * CRCs begin at ``first``: the pieces they cover that are not checked yet are read
 * whole, each checked once (its bit set, matched or failed), and the reply cut from the
 * same bytes; once all are checked, just the bytes asked for are read.  A piece that
 * failed is EIO at once.  No lock: two threads reading the same unchecked piece
 * together both check it (1 MiB each), and nobody waits. */
int read_pieces(Tree *t, uint64_t first, uint64_t start, uint64_t length, uint64_t offset, uint64_t want,
                       uint8_t **out, size_t *skip)
{
    uint64_t low = offset / PIECE_SIZE, high = (offset + want - 1) / PIECE_SIZE + 1;
    uint64_t from = offset, to = offset + want;
    int unchecked = 0;
    for (uint64_t p = low; p < high; p++) {
        if (bit_of(t->piece_failed, first + p))
            return checksum_eio();  /* found damaged at an earlier read (logged then) */
        unchecked |= !bit_of(t->piece_checked, first + p);
    }
    if (unchecked) {
        from = low * PIECE_SIZE;
        to = high * PIECE_SIZE < length ? high * PIECE_SIZE : length;
    }
    uint8_t *buffer = malloc(to - from);
    if (buffer == NULL)
        return ENOMEM;
    /* A large file read in the kernel's READs: a remote archive's read-ahead stops at
     * its end (as Python's piece reads tell CachedSource), not past it into others'. */
    remote_limit = start + length;
    int error = read_exactly(t, buffer, to - from, start + from);
    remote_limit = 0;
    for (uint64_t p = low; !error && unchecked && p < high; p++) {
        uint64_t piece = first + p;
        if (bit_of(t->piece_checked, piece))
            continue;
        uint64_t at = p * PIECE_SIZE - from, size = length - p * PIECE_SIZE < PIECE_SIZE ? length - p * PIECE_SIZE
                                                                                      : PIECE_SIZE;
        uint32_t crc = crc_update(0, buffer + at, (size_t) size);
        uint64_t stored_at = (uint64_t) (t->piece_crc - t->base) + 4 * piece;
        if (pages_ok(t, PIECE_REGION(2), stored_at, stored_at + 4)) {
            error = EIO;  /* the stored CRC is on a damaged page (logged): no verdict on the piece */
            break;
        }
        if ((uint32_t) crc == u32_at(t->piece_crc + 4 * piece)) {
            if (!t->check_always)
                set_bit(t->piece_checked, piece);
            continue;
        }
        if (!tree_changed(t)) {
            log_line(t, ((uint64_t) 1 << 61) + piece, "'%s': piece %llu of a record at offset %llu: "
                     "checksum mismatch (the archive is damaged): its file answers EIO there", t->name,
                     (unsigned long long) p, (unsigned long long) start);
            set_bit(t->piece_failed, piece);
        }
        error = checksum_eio();
    }
    if (error) {
        free(buffer);
        return error;
    }
    *out = buffer;
    *skip = (size_t) (offset - from);
    return 0;
}

/* Bytes [offset, offset + want) of record ``record`` (stored at [start, end), named by
 * ``entry``) as stored, checked as format sections 1 and 4b say: *out (malloc'ed) from
 * *skip on.  For READ ``park`` (or NULL): PARKED when it waits for another thread's
 * check of the record, which then answers it. */
int read_stored(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t offset,
                       uint64_t want, uint8_t **out, size_t *skip, const Parked *park)
{
    uint64_t length = end - start;
    int error;
    int unchecked = !record_checked(t, record);
    if (unchecked && record_failed(t, record))
        return checksum_eio();  /* found damaged at an earlier read (logged then) */
    uint64_t from = offset, count = want;
    if (unchecked && length > PIECE_SIZE) {
        uint64_t first;
        if ((error = pieces_of(t, entry, record, length, &first)) != 0)
            return error;
        if (first != NO_PIECES)
            return read_pieces(t, first, start, length, offset, want, out, skip);
    }
    if (unchecked && length <= MAX_REQUEST) {
        from = 0;  /* the whole record: one pread serves the check and the reply */
        count = length;
    } else if (unchecked && (error = check_record(t, record, start, end, NULL, park)) != 0) {
        return error;
    }
    uint8_t *buffer = malloc(count ? count : 1);
    if (buffer == NULL)
        return ENOMEM;
    error = read_exactly(t, buffer, count, start + from);
    if (!error && unchecked && length <= MAX_REQUEST)
        error = check_record(t, record, start, end, buffer, NULL);
    if (error) {
        free(buffer);
        return error;
    }
    *out = buffer;
    *skip = (size_t) (offset - from);
    return 0;
}

/* tree_read, for READ ``park`` (or NULL): PARKED when it waits for another thread's
 * check of its record, which then answers it. */
int read_or_park(Tree *t, uint64_t inode, uint64_t offset, size_t size, uint8_t **out, size_t *got,
                        size_t *skip, const Parked *park)
{
    uint64_t entry, record, start, end, length;
    unsigned type;
    CodecRow row;
    int error = typed_entry(t, inode, &entry, &type);
    if (error)
        return error;
    if (type != S_IFREG)
        return type == S_IFDIR ? EISDIR : EINVAL;
    if ((error = record_of(t, entry, &record, &start, &end, &row, &length)) != 0)
        return error;
    *out = NULL;
    *got = *skip = 0;
    if (offset >= length || size == 0)
        return 0;
    uint64_t want = length - offset < size ? length - offset : size;
    error = row.codec == CODEC_STORED ? read_stored(t, entry, record, start, end, offset, want, out, skip, park)
                                      : read_decoded(t, entry, record, start, end, length, &row, offset, want, out);
    if (!error)
        *got = (size_t) want;
    return error;
}

/* Up to ``size`` bytes of file inode ``inode`` from ``offset``: *out (malloc'ed, free
 * it) and *got, or an errno.  A whole small record is read once and checked from the
 * same bytes; a large one with piece CRCs, piece by piece; a large one without them is
 * checked whole, by one thread at a time (the others wait). */
int tree_read(Tree *t, uint64_t inode, uint64_t offset, size_t size, uint8_t **out, size_t *got,
                     size_t *skip)
{
    return read_or_park(t, inode, offset, size, out, got, skip, NULL);
}

/* Symlink inode ``inode``'s target into ``target`` (MAX_SYMLINK_TARGET + 1 bytes),
 * NUL-terminated: non-empty, no NUL byte, at most 4,095 bytes, its CRC checked. */
int tree_readlink(Tree *t, uint64_t inode, char *target)
{
    uint64_t entry, record, start, end;
    unsigned type;
    int error = typed_entry(t, inode, &entry, &type);
    if (error)
        return error;
    if (type != S_IFLNK)
        return EINVAL;
    if ((error = contents_of(t, entry, type, &record, &start, &end)) != 0)
        return error;
    size_t length = (size_t) (end - start);
    if ((error = read_exactly(t, (uint8_t *) target, length, start)) != 0)
        return error;
    if (memchr(target, 0, length))
        return broken(t, entry, 12, "is a symlink whose target holds a NUL byte");
    target[length] = 0;
    return check_record(t, record, start, end, (const uint8_t *) target, NULL);
}


/* -- a whole file in one read (packfs.core._format's read_file) ---------------------- */

int locate_whole_file(Tree *t, const uint8_t *path, size_t length, WholeFile *f)
{
    uint64_t found;
    unsigned type;
    int error = tree_find(t, path, length, &found);
    if (!error)
        error = typed_entry(t, found + 1, &f->entry, &type);
    if (!error && type != S_IFREG)
        error = type == S_IFDIR ? EISDIR : EINVAL;
    if (!error)
        error = record_of(t, f->entry, &f->record, &f->start, &f->end, &f->row, &f->size);
    return error;
}

int check_record_bytes(Tree *t, uint64_t record, uint64_t start, uint64_t end, const uint8_t *data)
{
    return check_record(t, record, start, end, data, NULL);
}

/* Copied from the map where it is guarded and smaller than MAP_COPY_BYTES, as
 * packfs.core's Container.read_record does (a truncation under the copy reads zeros,
 * and the caller's finished() answers EIO); with pread otherwise, so that a large
 * file's pages do not join the process's RSS and an unguarded map is never touched.
 * The CRC is checked over the bytes copied: the bytes answered are the bytes checked. */
int read_record_into(Tree *t, uint64_t record, uint64_t start, uint64_t end, uint8_t *into)
{
    if (!record_checked(t, record) && record_failed(t, record))
        return checksum_eio();  /* found damaged at an earlier read (logged then) */
    uint64_t length = end - start;
    int error = 0;
    if (t->guard >= 0 && length < MAP_COPY_BYTES)
        memcpy(into, t->base + start, (size_t) length);
    else
        error = read_exactly(t, into, length, start);
    if (!error && !record_checked(t, record))
        error = check_record(t, record, start, end, into, NULL);
    return error;
}
