"""The packfs archive format, version 1.  This docstring is the specification.

A packfs archive is an FFRecord container whose last records describe a directory tree.
FFRecord's own ``FileReader`` opens it as a plain sequence of records.

1. Container (FFRecord's layout, unchanged)
-------------------------------------------
All integers are little-endian.  There is no magic and no padding in the header::

    offset        size   field
    0             4      checksum_meta   u32   CRC-32 of bytes [4, 12 + 12n)
    4             8      n               i64   number of records
    12            4n     crc[i]          u32   CRC-32 of record i's bytes
    12 + 4n       8n     offset[i]       i64   absolute file offset of record i
    12 + 12n      ...    record bytes, back to back

Record ``i`` spans ``[offset[i], offset[i+1])``; the last record ends at the end of the
file, so the file size is part of the format.  CRC-32 is zlib's (reflected polynomial
0xEDB88320, init and xorout 0xFFFFFFFF; the CRC of zero bytes is 0).

A reader must reject: a file shorter than 12 bytes; ``n < 0``; ``12 + 12n`` greater than
the file size; ``checksum_meta`` not matching (when checking data); offsets that are not
``12 + 12n <= offset[0] <= offset[1] <= ... <= offset[n-1] <= file size``.
``checksum_meta == 0`` is FFRecord's "legacy file" marker; packfs refuses it.

2. Record order in a packfs archive
-----------------------------------
With ``D`` data records and ``S`` sections (``S = 15`` in versions 1.0 and 1.1, ``18`` in
1.2: the 15 of the path table, then the 3 of the piece CRCs, section 4b; ``21`` in 1.3:
then the 3 of the extended attributes, section 4c; ``23`` in 1.4: then the lookup index
and the tail, sections 4d and 4e)::

    records 0 .. D-1        data: file contents and symlink targets, one record each
    record  D + 2k          padding before section k: zero bytes, so that section k
                            starts at a file offset that is a multiple of 64
    record  D + 2k + 1      section k (k = 0 .. S-1)
    [one empty record]      present only when it makes n odd, so that the offset
                            table (at 12 + 4n) is 8-byte aligned
    record  n - 1           the footer

Data records that no entry references are allowed and must be empty (a writer may
reserve header slots it then does not use).  ``pack`` writes data records in
depth-first order of paths, with names sorted bytewise, so the files of one directory
are adjacent; readers do not depend on that order.

3. Footer (the last record, exactly 64 bytes; ``FOOTER``)
----------------------------------------------------------
::

    offset  size  field
    0       8     magic                b"\\x93PACKFS\\x00"
    8       2     version_major  u16   1
    10      2     version_minor  u16   2 to 5 (1.1 gave section 11 its meaning;
                                       1.2 added sections 15-17, section 4b; 1.3
                                       sections 18-20, section 4c; 1.4 sections
                                       21-22, sections 4d and 4e; 1.5 sections
                                       22-23 before the tail, section 4f)
    12      4     flags          u32   a reader rejects any bit it does not know;
                                       FLAG_CODECS (1): section 4f (version 1.5)
    16      8     entry_count    u64   N, the number of path-table entries (>= 1)
    24      8     data_records   u64   D
    32      4     section_count  u32   S; 15 in versions 1.0 and 1.1, 18 in 1.2,
                                       21 in 1.3, 23 in 1.4
    36      8     tail_size      u64   1.4: the tail's length in bytes (section 4e);
                                       before: zero
    44      4     tail_crc       u32   1.4: CRC-32 of the tail's bytes followed by the
                                       footer's bytes [0, 44) and [48, 64); before: zero
    48      16    reserved             zero

Version policy: a reader rejects another ``version_major``.  A higher
``version_minor`` only adds things an older reader may ignore (sections after the
known ones, meanings for reserved bytes), so it is accepted.  An archive carries only
the steps it uses: a writer gives it the lowest minor version whose sections hold what
it stores.  Since 1.4 every archive uses the tail and the lookup index (sections 4d and
4e), so a writer writes 1.4, with sections 18-20 empty (``X = 0``) when no entry has an
extended attribute; a writer that leaves the tail out writes 1.2 or 1.3 as before.
What a step an older reader must not ignore would set is a ``flags`` bit (none is
defined yet).

4. Path table (sections 0..14)
------------------------------
The table has N entries: directories, regular files and symlinks.  Entry 0 is the
root directory (parent 0, empty name).  Entries are in breadth-first order and the
children of every directory are one contiguous range, sorted bytewise by name.  Each
column is its own section, an array of N little-endian values indexed by entry:

    k   name          type  meaning
    0   parent        u32   entry index of the parent directory (0 for the root)
    1   mode          u32   st_mode: file type (S_IFDIR, S_IFREG or S_IFLNK) and
                            permission bits
    2   uid           u32   owner
    3   gid           u32   group
    4   mtime_ns      i64   modification time, nanoseconds since the epoch
    5   size          u64   file: its length; symlink: the target's length; dir: 0
    6   record        u64   file, symlink: the data record holding the contents or
                            the target; dir: 2**64 - 1
    7   child_start   u32   dir: index of its first child; others: 0
    8   child_count   u32   dir: number of children; others: 0
    9   name_end      u64   end of this entry's name in section 12; entry i's name is
                            names[name_end[i-1] : name_end[i]] (the root's is empty,
                            name_end[0] = 0)
    10  nlink         u32   file: entries sharing its record (hard links); dir: 2 +
                            its sub-directories; symlink: 1
    11  first_link    u32   file with nlink > 1: the lowest entry index sharing its
                            record (its "first name"); every name of the file reports
                            inode number first_link + 1.  Otherwise 0.  (Version 1.1;
                            1.0 wrote 0 everywhere, and a reader derives it then.)
    12  names         u8    all names, in entry order, with no separators
    13  path_hash     u32   sorted ascending: CRC-32 of each entry's full path
    14  path_entry    u32   the entry index for path_hash[j] (ties sorted by index)

A full path is the names from the root down joined by ``/``, with no leading slash;
the root's is the empty string.  Names are raw bytes (POSIX names need not be UTF-8).

To look a path up, compute its CRC-32, binary-search ``path_hash`` and compare the
full path of each entry in the run of equal hashes (different paths can share a CRC).
To list a directory, read its children range; to find one name in it, binary-search
that range.

An entry's inode number is its index + 1 (the root is 1), except that all names of a
hard-linked file share the inode number of the first (``first_link + 1``), and its
attributes: a reader shows the first name's mode, owner, mtime and size under every
name (a writer stores the same under each).

4b. Piece CRCs (sections 15..17, version 1.2)
---------------------------------------------
A record's CRC covers all of it, so a reader that checks before it answers must read
a whole 10 GiB file before the first byte of it can be trusted.  Version 1.2 adds a
CRC for each ``PIECE_SIZE`` = 1 MiB piece of every data record longer than
``PIECE_SIZE`` bytes (piece ``p`` of a record is its bytes ``[p * PIECE_SIZE, (p + 1)
* PIECE_SIZE)``, the last one possibly shorter), so a reader checks just the pieces a
read covers.  The record's own CRC is still written (FFRecord's readers check it, and
so do ``verify`` and ``unpack``).  With ``M`` such records::

    k   name          type  items   meaning
    15  piece_record  u64   M       the data records that have piece CRCs, ascending
    16  piece_start   u64   M + 1   piece_start[j]: index in piece_crc of the first
                                    piece of piece_record[j]; piece_start[0] = 0 and
                                    piece_start[M] is the number of piece CRCs
    17  piece_crc     u32   P       CRC-32 of each piece, record after record

Each section is 64-byte aligned, with its padding record before it, like the table's.
A writer lists every data record longer than ``PIECE_SIZE`` and no other; a reader
that finds a record not listed checks it whole, as in 1.1.  An older reader ignores
the three sections (section 3's version policy).

4c. Extended attributes (sections 18..20, version 1.3)
-----------------------------------------------------
An entry's extended attributes (``user.*``, ``security.*`` such as SELinux labels and
file capabilities, ``trusted.*``, and ``system.*`` such as POSIX ACLs) are a list of
(name, value) pairs.  With ``X`` entries that have at least one::

    k   name          type  items   meaning
    18  xattr_entry   u32   X       the entries that have attributes, strictly ascending
    19  xattr_start   u64   X + 1   xattr_start[j]: where xattr_entry[j]'s list starts in
                                    section 20; xattr_start[0] = 0 and xattr_start[X] is
                                    the length of section 20
    20  xattr_data    u8    -       each listed entry's attributes, back to back, sorted
                                    bytewise by name, each encoded as (``XATTR``):

        offset  size  field
        0       1     name_length   u8    1 .. XATTR_NAME_MAX (255)
        1       4     value_length  u32   0 .. XATTR_SIZE_MAX (65,536)
        5       ...   the name, then the value

Attributes belong to a file, not to a name: they are listed under the entry whose
index is the inode number less 1 (section 4), so the names of a hard-linked file all
have its first name's attributes, and a writer lists none under its other names.  A
name is one of the four namespaces above followed by at least one byte, with no NUL;
an entry's names are distinct.  Before 1.4 a writer gives an archive these sections
(and version 1.3) only when some entry has an attribute; from 1.4 on they are always
there, empty (``X = 0``) when no entry has one.  An older reader ignores them.

4d. Lookup index (section 21, version 1.4)
-----------------------------------------
Everything a reader needs to stat and read one path, in one place, so that a reader of
a remote archive fetches one page of it and then the file.  Rows, one per entry, sorted
by ``(path_hash, entry)`` (section 13's order), back to back; each row is (``INDEX_ROW``)::

    offset  size  field
    0       4     path_hash    u32  CRC-32 of the entry's full path (section 13)
    4       4     entry        u32  its index in the table
    8       4     mode         u32  \
    12      4     uid          u32   |
    16      4     gid          u32   | its columns, as in the table (a hard link's
    20      4     nlink        u32   | name carries the file's, section 4)
    24      4     inode        u32  /  the inode number it reports (section 4)
    28      4     crc          u32  its record's CRC (section 1); 0 for a directory
    32      8     mtime_ns     i64
    40      8     size         u64
    48      8     record       u64  its data record; 2**64 - 1 for a directory
    56      8     offset       u64  its record's file offset; 0 for a directory
    64      4     path_length  u32
    68      ...   the full path (section 4), path_length bytes

The rows are grouped into pages of at most ``page_size`` bytes (the tail's, 4e; a
page holds at least one row, so one longer row is a page of its own), and a page
boundary never falls between two rows of the same ``path_hash``, so the one page
that can hold a path is the last whose first hash is at most the path's.  The tail
lists each page's first hash, CRC and start.

4e. Tail (section 22, version 1.4)
----------------------------------
The last section, so its bytes end where the footer begins (the parity record, if
any, is empty).  It locates every other section and carries the CRCs that let a
reader check the table, the header's arrays and the lookup index one page at a time,
so an archive of any size opens from one read of its last bytes (at most
``TAIL_MAX`` bytes and the footer; a writer raises ``page_size`` until the tail fits).
Its own CRC is in the footer (section 3, ``tail_crc``).  It is (``TAIL_HEADER``, then
arrays, all little-endian)::

    offset  size  field
    0       8     magic        b"PACKTAIL"
    8       4     page_size    u32  a power of two, at least TABLE_PAGE_MIN = 65,536
    12      4     spans        u32  K = S - 1, every section but the tail: 22
                                    (sections 0 .. 21) in 1.4, 24 in 1.5 (4f)
    16      8     n            u64  the container's record count (section 1)
    24      8     data_end     u64  offset[D]: where the data records end
    32      8     index_pages  u64  Q, the lookup index's pages
    40      8     file_size    u64  the archive's size
    48      16    reserved     zero
    64      16K   section k's (start u64, length u64), k = 0 .. K - 1
    ...     4P    page CRCs, u32, region after region:
                    the header's CRCs of the data records, bytes [12, 12 + 4D);
                    the header's offsets of the data records and offset[D], bytes
                    [12 + 4n, 12 + 4n + 8(D + 1));
                    sections 0 .. 20, each its own region;
                  page p of a region is its bytes [p * page_size, (p + 1) * page_size),
                  the last one possibly shorter; an empty region has no pages
    ...     16Q   the lookup index's pages: (first_hash u32, crc u32, start u64), start
                  being the page's offset in section 21, ascending from 0

so the tail is exactly ``64 + 16K + 4P + 16Q`` bytes.  The page CRCs cover only what
the tail does not locate itself: the header entries of the section, parity and footer
records are not needed by a reader that has the tail (and cannot be covered: the
header holds the tail's own CRC).

A reader with the tail needs nothing else at open.  It checks the tail against the
footer's ``tail_crc``, the geometry (``n`` as in the header, ``file_size`` the source's,
each span inside ``[12 + 12n, file_size)``, 64-byte aligned, the lengths of section 4's
columns, the CRC count), and then checks each page of a region or of the index the
first time it uses a value in it.  A reader that ignores the tail (1.3 and older)
checks the header and every section whole at open, as before.

4f. Codecs (sections 22..23, version 1.5, footer flag ``CODECS``)
----------------------------------------------------------------
Compressed, deduplicated and sparse files.  An archive that uses any of them sets the
footer's ``flags`` bit ``FLAG_CODECS`` (1), so that a reader that does not know this
section refuses it instead of serving stored bytes as contents; it has version 1.5 and
``S = 25`` sections: sections 0 .. 21 as in 1.4, then ``record_codec`` (22) and
``codec_data`` (23), then the tail, which is always the last section (in a 1.5 archive
section 24; its ``spans`` field is ``S - 1`` = 24, locating sections 0 .. 23, and its
page CRCs cover sections 0 .. 20, 22 and 23, each its own region, after the header's).
An archive without codecs is written as 1.4, byte for byte as before.

The stored bytes of a data record are what its record CRC (section 1), its pieces
(4b) and FFRecord's reader see; a file's contents are its record *decoded*, and its
``size`` column is the decoded length.  ``record_codec`` has one row per data record
(``D`` rows of ``CODEC_ROW``, 16 bytes)::

    offset  size  field
    0       1     codec        u8   CODEC_STORED (0), CODEC_ZSTD (1), CODEC_FRAMES (2),
                                    CODEC_SPARSE (3) or CODEC_DICTIONARY (4)
    1       1     frame_log2   u8   CODEC_FRAMES: log2 of its frame size F, from
                                    FRAME_LOG2_MIN (16) to FRAME_LOG2_MAX (20); else 0
    2       2     reserved          zero
    4       4     check        u32  CODEC_ZSTD: CRC-32 of the decoded bytes; else 0
    8       8     aux          u64  CODEC_ZSTD: the dictionary's data record, or
                                    2**64 - 1 for none; CODEC_FRAMES, CODEC_SPARSE: where
                                    its frame table or extent list starts in section 23
                                    (a byte offset, a multiple of 8); else 0

- ``CODEC_STORED``: the record is the contents (the only codec before 1.5).
- ``CODEC_ZSTD``: the record is one zstd frame (RFC 8878) that decodes to exactly
  ``size`` bytes, at most ``ZSTD_SIZE_MAX`` = 1 MiB, whose CRC-32 is ``check``; with a
  dictionary, the frame was compressed with that record's bytes as a zstd dictionary.
- ``CODEC_FRAMES``: the record is ``count = ceil(size / F)`` independent zstd frames;
  frame ``k`` decodes to bytes ``[k F, min((k + 1) F, size))`` of the file, so a read at
  any offset decodes one frame per ``F`` bytes it covers.  Its frame table at ``aux`` in
  section 23 is ``count`` rows of ``FRAME_ROW`` (16 bytes)::

      0   8   stored_end   u64  where frame k ends in the record (it starts where
                                frame k-1 ends, frame 0 at 0); strictly ascending
      8   4   stored_crc   u32  CRC-32 of frame k's stored bytes
      12  4   decoded_crc  u32  CRC-32 of frame k's decoded bytes

  After the last frame the record holds zstd's seekable-format seek table (a skippable
  frame: each frame's stored and decoded sizes, then the frame count, a descriptor
  byte 0 and the magic 0x8F92EAB1), so the record is a file of zstd's seekable format
  as well as a plain zstd stream (``zstd -d`` decodes it); packfs readers use the frame
  table and check ``stored_end[count - 1] <= length``.
- ``CODEC_SPARSE``: a file with holes.  Its extent list at ``aux`` in section 23 is a
  count ``u64`` and then that many (``offset u64``, ``length u64``) data extents
  (``EXTENT``), ascending, non-empty, not overlapping and inside ``[0, size)``; the record
  holds their bytes back to back (the lengths add up to its length), checked like any
  record's (section 1, 4b).  Every byte of the file outside the extents reads as zero.
- ``CODEC_DICTIONARY``: the record is a zstd dictionary (at most ``DICTIONARY_MAX`` =
  1 MiB) that ``CODEC_ZSTD`` rows name; no entry names it.

A symlink's record is always ``CODEC_STORED`` (its target is read where a path is
resolved, and is at most 4,095 bytes); a reader refuses any other codec for it.

Records shared by contents (deduplication): in an archive with ``FLAG_CODECS``, regular
files with equal contents may name one record, each keeping its own mode, owner, mtime,
inode number and ``nlink`` (unlike hard links, section 4); ``first_link`` stays the
hard-link rule.  ``unpack`` writes each such name as its own file.

Where used (section 5's style: nothing here is read at open):

- a row is used only if its codec is known and its fields obey the codec (reserved
  zero, ``frame_log2`` in range for frames and 0 otherwise, ``aux`` a dictionary record
  whose row is ``CODEC_DICTIONARY``, or a table inside section 23);
- a file's record must not be a ``CODEC_DICTIONARY`` record; ``size`` equals the record's
  length for ``CODEC_STORED``, is at most ``ZSTD_SIZE_MAX`` for ``CODEC_ZSTD``, and is at
  most ``2**63 - 1`` for the others, whose tables bound it: ``aux + 16 * count`` must lie
  inside section 23 for frames, and the extent list must too;
- a reader decodes into exactly the bytes it expects (one frame at most ``F``, a
  ``CODEC_ZSTD`` file at most 1 MiB): a frame that decodes to more or fewer bytes, or
  whose bytes do not match their CRCs, is a FormatError, so a decompression bomb costs
  no more memory or time than an honest frame of that size;
- stored bytes are checked before they are decoded (the record CRC for ``CODEC_ZSTD``,
  ``stored_crc`` for a frame, the record CRC or pieces for ``CODEC_SPARSE``), decoded
  bytes after (``check``, ``decoded_crc``).

``verify`` also checks every row, table and list, decodes every file whole and checks
that data records which no file names are dictionaries or empty.

5. What a reader must reject, and when
--------------------------------------
At open, with no per-entry work: besides the header rules of section 1 (the offsets
excepted, see below), a last record that is not a 64-byte footer with
the magic; another major version; unknown flags; ``section_count < 15`` (``< 18``
from version 1.2 on); ``n`` not
equal to ``D + 2S + 1`` plus the parity record; a section whose length is not ``N``
times its item size (section 12: ``name_end[N-1]``); a section not starting at a
multiple of 64; a root entry that is not a directory with parent 0 and an empty name;
from 1.2, a piece section (4b) not 64-byte aligned, ``piece_record`` not a multiple
of 8 bytes, ``piece_start`` not ``8 (M + 1)`` bytes, ``piece_start[0] != 0``, ``M >
D``, ``piece_crc`` not ``4 * piece_start[M]`` bytes, or more piece CRCs than the data
area can have (``piece_start[M] > M + (offset[D] - (12 + 12n)) / PIECE_SIZE``, which
bounds what a reader allocates for them); from 1.3, ``section_count < 21``, an
attribute section (4c) not 64-byte aligned or not a whole number of its items,
``X > N``, ``xattr_start`` not ``X + 1`` items, ``xattr_start[0] != 0`` or
``xattr_start[X]`` not the length of ``xattr_data``.
When checking data, also a CRC mismatch in the header or a table section: one pass
over their bytes (about 100 bytes per entry) at CRC speed, not a walk of the table.
From 1.4 (an archive with a tail): at open, a ``tail_size`` below 64 or beyond the
file, a tail whose CRC (``tail_crc``) does not match, a tail without its magic, a page
size that is not a power of two of at least 65,536, another span count than 22 (24
with ``FLAG_CODECS``, section 4f),
another ``file_size`` than the file's, ``n`` other than the header's or fewer than
``D`` records, ``data_end`` outside ``[12 + 12n, file_size]``, a span not 64-byte
aligned, before the previous one's end or past the tail's start, a tail length other
than its geometry's, index page starts not ascending from 0, or no index page for a
table with entries; nothing else is read at open.  Where used: a page (of a region, or
of the lookup index) whose CRC does not match, and in an index row an entry or inode
beyond the table, a record that is not a data record, or a row cut by its page's end.
A reader that reads the table page by page checks the root's rules (above) when the
pages holding them arrive.

Where a value is used, the rule that makes that use safe (opening never walks the
table; ``verify`` checks every rule at once):

- record ``i``'s offsets: ``12 + 12n <= offset[i] <= offset[i+1] <= file size``,
  and for a data record (``i < D``) ``offset[i+1] <= offset[D]``: data records end
  where the table begins (at the padding record before section 0), so no file's
  contents include table or footer bytes (O(1): ``offset[D]`` is read at open);
- ``parent < i`` for every entry but the root, so full paths end;
- a directory's children come after it: ``i < child_start`` and
  ``child_start + child_count <= N``, so walks end; and each of them names it as its
  parent, so no entry is reached from two directories and a walk takes O(N) steps
  (overlapping child ranges would make it exponential);
- a name is non-empty, lies in the names section, is not ``.`` or ``..`` and
  contains no ``/`` and no NUL byte (its length: below);
- the file type is a directory, a regular file or a symlink;
- files and symlinks name a record below D whose length equals their size (checked
  before a size is handed out, by stat as by a read: a reader that shows a size its
  reads refuse makes the kernel serve a file shorter or longer than its contents);
- a symlink's target (its record) is non-empty, has no NUL byte and is at most
  ``MAX_SYMLINK_TARGET`` = 4,095 bytes (Linux's PATH_MAX less its NUL: no kernel
  creates a longer one, and a reader following a longer one would spend time in
  proportion to it; a writer refuses one).  A reader resolving a path follows at most
  40 symlinks (Linux's MAXSYMLINKS), so one resolution walks at most 40 x 4,095 bytes
  of targets besides the path itself;
- ``path_entry`` values are below N;
- a non-zero ``first_link`` is at most the entry's own index and names a regular
  file with the same record;
- a record's pieces (4b), found by binary search of ``piece_record``, are used only if
  ``piece_start[j] <= piece_start[j+1] <= piece_start[M]`` and ``piece_start[j+1] -
  piece_start[j]`` is the record's piece count, ``ceil(length / PIECE_SIZE)``; else the
  archive is malformed.  A ``piece_record`` that is not ascending can only hide a
  record from the search, which is then checked whole;
- an entry's attributes (4c), found by binary search of ``xattr_entry`` (for the
  inode's entry), are used only if ``xattr_start[j] <= xattr_start[j+1] <=
  xattr_start[X]`` and the span parses exactly into pairs that obey 4c's rules
  (lengths within the span, names valid and strictly ascending, each value at most
  XATTR_SIZE_MAX, the names with a NUL each at most ``XATTR_LIST_MAX`` = 65,536 bytes,
  what Linux's listxattr can return); else the archive is malformed, for that entry.
  An ``xattr_entry`` that is not ascending can only hide an entry from the search.

A name is at most ``NAME_MAX`` = 255 bytes, Linux's NAME_MAX: ext4, XFS, Btrfs and
tmpfs hold no longer one, so a longer name comes only from a tar or zip (which can
store one, and which GNU tar cannot extract either), and could not be unpacked.  No
use of a longer name is unsafe, so it is not a rule a reader relies on: a writer
refuses one (a tar or zip member with one is skipped, with a
warning), ``verify`` reports each, naming the entry, and a reader that hands names to
the kernel (a mount) leaves such an entry out of its directory's listing, logged, and
answers a lookup of it with ENAMETOOLONG, as a disk's file system does, instead of
failing the whole directory (FUSE carries longer names: up to 1,024 bytes on older
kernels, 4,094 on Linux 6.18).  A reader of the library (``PackedFolder``) returns it.

Before writing out a whole archive (``unpack``, ``convert``), all at once, because
what is written is what the table claims, not what was read: the offsets are
non-decreasing (section 1), and each data record is named by one entry or by every
name of one hard-linked file (regular files whose ``nlink`` is the number of entries
naming the record and whose ``first_link`` is the same; a regular file's ``nlink``
always counts the entries naming its record).  Distinct records then do not overlap,
so the bytes written (each record once; the other names of a file are hard links) are
at most the data area, at most the archive's size.  Without these rules backwards
offsets let many records cover the same bytes, each with a valid CRC, and an archive
of 1 MB unpacked to 200 MB.  One pass over the offsets and two over four columns, in
chunks, with 8 bytes per data record (``PathTable.check_records``).  A reader that
serves files one at a time needs neither: each read is its record's bytes, checked
against that record's CRC, and equal bytes read twice are the same contents.

By ``verify``, the rules that make lookups and listings agree but that no single
access relies on (from 1.4 also: the tail's spans and ``data_end`` are the header's
offsets; every page CRC matches; the index has one row per entry, sorted by hash, no
hash split between pages, each page's first hash as the tail says, and each row
equal to the table's columns, the entry's full path and its record's header CRC
and offset): each entry's parent is a directory whose child range holds it (the
converse is checked where used, above); the
child counts add up to ``N - 1``; ``piece_record`` is strictly ascending, below ``D``,
lists exactly the records longer than ``PIECE_SIZE``, each with its piece count, and
every piece CRC matches its bytes; ``xattr_entry`` is strictly ascending and below
``N``, lists no name of a hard-linked file but its first, and every listed entry's
attributes parse; non-directories have ``child_start == child_count
== 0`` and directories record 2**64 - 1; ``path_hash`` is sorted and each hash is its
path's CRC-32.  A reader therefore never indexes out of bounds, never loops and never
produces a name that leaves the tree: an inconsistent table is an error where it is
met, and ``verify`` finds all of it.
"""

from __future__ import annotations

import codecs
import re
import stat as stat_module
import struct
from typing import NamedTuple

from zlib_ng import zlib_ng

from .errors import FormatError

__all__ = [
    "MAGIC",
    "VERSION_MAJOR",
    "VERSION_MINOR",
    "HEADER_PREFIX",
    "FOOTER",
    "FOOTER_SIZE",
    "SECTION_ALIGNMENT",
    "SECTIONS",
    "SECTION_COUNT",
    "PIECE_SECTIONS",
    "PIECE_SIZE",
    "PIECES_SINCE_MINOR",
    "WRITTEN_SECTION_COUNT",
    "piece_count",
    "XATTR_SECTIONS",
    "XATTRS_SINCE_MINOR",
    "XATTR",
    "XATTR_NAME_MAX",
    "XATTR_SIZE_MAX",
    "XATTR_LIST_MAX",
    "XATTR_NAMESPACES",
    "xattr_name_problem",
    "section_count_for",
    "INDEX_SECTIONS",
    "INDEX_SINCE_MINOR",
    "INDEX_ROW",
    "TAIL_HEADER",
    "TAIL_MAGIC",
    "TAIL_SPAN",
    "TAIL_SPAN_COUNT",
    "INDEX_PAGE",
    "TABLE_PAGE_MIN",
    "TAIL_MAX",
    "FOOTER_TAIL",
    "tail_crc",
    "tail_span_count",
    "FLAG_CODECS",
    "KNOWN_FLAGS",
    "CODECS_SINCE_MINOR",
    "CODEC_SECTIONS",
    "RECORD_CODEC_SECTION",
    "CODEC_DATA_SECTION",
    "CODEC_ROW",
    "FRAME_ROW",
    "EXTENT",
    "EXTENT_COUNT",
    "CODEC_STORED",
    "CODEC_ZSTD",
    "CODEC_FRAMES",
    "CODEC_SPARSE",
    "CODEC_DICTIONARY",
    "CODEC_NAMES",
    "FRAME_LOG2_MIN",
    "FRAME_LOG2_MAX",
    "ZSTD_SIZE_MAX",
    "DICTIONARY_MAX",
    "SEEKABLE_MAGIC",
    "SKIPPABLE_SEEK_TABLE_MAGIC",
    "NO_RECORD",
    "MAX_SYMLINK_TARGET",
    "NAME_MAX",
    "name_length_problem",
    "path_name_problem",
    "Footer",
    "crc32",
    "header_size",
    "record_count_for",
    "pack_footer",
    "unpack_footer",
    "foreign_format",
    "SNIFF_BYTES",
    "S_IFMT",
    "S_IFDIR",
    "S_IFREG",
    "S_IFLNK",
    "symlink_target_problem",
    "symlink_length_problem",
]

MAGIC = b"\x93PACKFS\x00"
VERSION_MAJOR = 1
VERSION_MINOR = 5  # the highest this packfs writes (section 3: only when used)

# Section 1: checksum_meta u32, n i64.  The arrays that follow are read as numpy views.
HEADER_PREFIX = struct.Struct("<Iq")

# Section 3: magic, version_major, version_minor, flags, entry_count, data_records,
# section_count, 28 reserved bytes.
FOOTER = struct.Struct("<8sHHIQQI28s")
FOOTER_SIZE = FOOTER.size  # 64
# Version 1.4's use of the footer's first reserved bytes (at offset 36): tail_size, tail_crc.
FOOTER_TAIL = struct.Struct("<QI")
_FOOTER_TAIL_AT = 36

SECTION_ALIGNMENT = 64
NO_RECORD = 2**64 - 1
# Section 5: the longest symlink target, in bytes (Linux's PATH_MAX of 4,096 less the NUL).
MAX_SYMLINK_TARGET = 4095

# Section 5: the longest name, in bytes (Linux's NAME_MAX: no Linux file system holds a longer one).
NAME_MAX = 255
_LONG_NAME = re.compile(rb"[^/]{%d}" % (NAME_MAX + 1))  # the leftmost match starts a name

# Section 4, mode: the file type bits, and the three types an entry may have.
S_IFMT = stat_module.S_IFMT(0o177777)
S_IFDIR = stat_module.S_IFDIR
S_IFREG = stat_module.S_IFREG
S_IFLNK = stat_module.S_IFLNK


def symlink_length_problem(length: int) -> str | None:
    """What is wrong with a symlink target ``length`` bytes long, or None: the length
    part of :func:`symlink_target_problem`, for refusing a target before it is read
    (and a symlink's size before it is handed out)."""
    if length == 0:
        return "an empty target"
    if length > MAX_SYMLINK_TARGET:
        return f"a target of {length} bytes, expected at most {MAX_SYMLINK_TARGET}"
    return None


def symlink_target_problem(target: bytes) -> str | None:
    """What makes ``target`` a symlink target the format does not allow (section 5:
    non-empty, no NUL byte, at most MAX_SYMLINK_TARGET bytes), or None: the one
    statement of the rule, for the writer, every reader and verify."""
    length_problem = symlink_length_problem(len(target))
    if length_problem:
        return length_problem
    if b"\0" in target:
        return f"the target {target!r}: containing a NUL byte"
    return None

def name_length_problem(name: bytes) -> str | None:
    """What makes ``name`` (one component of a path) longer than the format allows
    (section 5: at most NAME_MAX bytes), or None: the one statement of the rule, for the
    writer, ``verify`` and the mounts."""
    if len(name) > NAME_MAX:
        return f"a name of {len(name)} bytes, expected at most {NAME_MAX}"
    return None


def path_name_problem(path: bytes) -> str | None:
    """:func:`name_length_problem` of the first component of ``path`` (``/``-separated)
    that has one, or None."""
    if len(path) <= NAME_MAX:
        return None
    # A scan in C, with nothing split: the writer asks this of every path of a deep tree.
    found = _LONG_NAME.search(path)
    if found is None:
        return None
    end = path.find(b"/", found.start())
    return name_length_problem(path[found.start() : end if end >= 0 else len(path)])

# Section 4: (name, numpy dtype) in section order.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("parent", "<u4"),
    ("mode", "<u4"),
    ("uid", "<u4"),
    ("gid", "<u4"),
    ("mtime_ns", "<i8"),
    ("size", "<u8"),
    ("record", "<u8"),
    ("child_start", "<u4"),
    ("child_count", "<u4"),
    ("name_end", "<u8"),
    ("nlink", "<u4"),
    ("first_link", "<u4"),
    ("names", "u1"),
    ("path_hash", "<u4"),
    ("path_entry", "<u4"),
)
SECTION_COUNT = len(SECTIONS)  # the path table's; the fewest an archive may have

# Section 4b (version 1.2): the piece CRCs of records longer than PIECE_SIZE.
PIECE_SIZE = 1 << 20
PIECE_SECTIONS: tuple[tuple[str, str], ...] = (
    ("piece_record", "<u8"),
    ("piece_start", "<u8"),
    ("piece_crc", "<u4"),
)
PIECES_SINCE_MINOR = 2
WRITTEN_SECTION_COUNT = SECTION_COUNT + len(PIECE_SECTIONS)


# Section 4c (version 1.3): extended attributes, present only when an entry has one.
XATTR_SECTIONS: tuple[tuple[str, str], ...] = (
    ("xattr_entry", "<u4"),
    ("xattr_start", "<u8"),
    ("xattr_data", "u1"),
)
XATTRS_SINCE_MINOR = 3
XATTR = struct.Struct("<BI")  # name_length u8, value_length u32
# Linux's limits (linux/limits.h): what setxattr accepts and listxattr can return.
XATTR_NAME_MAX = 255
XATTR_SIZE_MAX = 65536
XATTR_LIST_MAX = 65536
XATTR_NAMESPACES = (b"user.", b"security.", b"trusted.", b"system.")


def xattr_name_problem(name: bytes) -> str | None:
    """What makes ``name`` an attribute name the format does not allow (section 4c:
    a known namespace and at least one byte more, no NUL, at most XATTR_NAME_MAX
    bytes), or None: the one statement of the rule, for the writer and every reader."""
    if len(name) > XATTR_NAME_MAX:
        return f"a name of {len(name)} bytes, expected at most {XATTR_NAME_MAX}"
    if b"\0" in name or not any(name.startswith(space) and len(name) > len(space) for space in XATTR_NAMESPACES):
        return f"the name {name!r}: expected user., security., trusted. or system. and a name, no NUL"
    return None


# Sections 4d and 4e (version 1.4): the lookup index and the tail, in every 1.4 archive.
INDEX_SECTIONS: tuple[tuple[str, str], ...] = (
    ("lookup_index", "u1"),
    ("tail", "u1"),
)
INDEX_SINCE_MINOR = 4
# path_hash, entry, mode, uid, gid, nlink, inode, crc, mtime_ns, size, record, offset,
# path_length; then the path.
INDEX_ROW = struct.Struct("<IIIIIIIIqQQQI")
TAIL_MAGIC = b"PACKTAIL"
# magic, page_size, spans, n, data_end, index_pages, file_size, 16 reserved bytes.
TAIL_HEADER = struct.Struct("<8sIIQQQQ16s")
TAIL_SPAN = struct.Struct("<QQ")  # a section's start and length
TAIL_SPAN_COUNT = 22  # sections 0 .. 21: all but the tail
INDEX_PAGE = struct.Struct("<IIQ")  # first_hash, crc, start
TABLE_PAGE_MIN = 1 << 16
# The most a tail may take, so the tail, the footer and the tail's padding are read by
# one suffix request of 1 MiB.
TAIL_MAX = (1 << 20) - 2 * FOOTER_SIZE


# Section 4f (version 1.5, footer flag FLAG_CODECS): compressed, shared and sparse records.
FLAG_CODECS = 1
KNOWN_FLAGS = FLAG_CODECS
CODECS_SINCE_MINOR = 5
CODEC_SECTIONS: tuple[tuple[str, str], ...] = (
    ("record_codec", "u1"),
    ("codec_data", "u1"),
)
RECORD_CODEC_SECTION = 22
CODEC_DATA_SECTION = 23
CODEC_ROW = struct.Struct("<BBHIQ")  # codec, frame_log2, reserved, check, aux
FRAME_ROW = struct.Struct("<QII")  # stored_end, stored_crc, decoded_crc
EXTENT = struct.Struct("<QQ")  # offset, length
EXTENT_COUNT = struct.Struct("<Q")
CODEC_STORED = 0
CODEC_ZSTD = 1
CODEC_FRAMES = 2
CODEC_SPARSE = 3
CODEC_DICTIONARY = 4
CODEC_NAMES = ("stored", "zstd", "zstd frames", "sparse", "dictionary")
FRAME_LOG2_MIN = 16
FRAME_LOG2_MAX = 20
ZSTD_SIZE_MAX = 1 << 20
DICTIONARY_MAX = 1 << 20
SEEKABLE_MAGIC = 0x8F92EAB1  # zstd's seekable format (contrib/seekable_format)
SKIPPABLE_SEEK_TABLE_MAGIC = 0x184D2A5E


def tail_span_count(section_count: int) -> int:
    """How many sections the tail locates (section 4e): every one before it."""
    return section_count - 1


def tail_crc(tail: bytes | memoryview, footer: bytes | memoryview) -> int:
    """Section 3's ``tail_crc`` of a 1.4 archive: the CRC-32 of its tail, then of its
    footer's bytes but the ``tail_crc`` field itself."""
    value = crc32(tail)
    value = crc32(footer[: _FOOTER_TAIL_AT + 8], value)
    return crc32(footer[_FOOTER_TAIL_AT + 12 :], value)


def section_count_for(minor: int) -> int:
    """The sections an archive of version 1.``minor`` has at least (section 3)."""
    if minor >= CODECS_SINCE_MINOR:
        return SECTION_COUNT + len(PIECE_SECTIONS) + len(XATTR_SECTIONS) + len(INDEX_SECTIONS) + len(CODEC_SECTIONS)
    if minor >= INDEX_SINCE_MINOR:
        return SECTION_COUNT + len(PIECE_SECTIONS) + len(XATTR_SECTIONS) + len(INDEX_SECTIONS)
    if minor >= XATTRS_SINCE_MINOR:
        return SECTION_COUNT + len(PIECE_SECTIONS) + len(XATTR_SECTIONS)
    if minor >= PIECES_SINCE_MINOR:
        return SECTION_COUNT + len(PIECE_SECTIONS)
    return SECTION_COUNT


def piece_count(length: int) -> int:
    """How many piece CRCs a record of ``length`` bytes has (section 4b): none up to
    PIECE_SIZE bytes (its record CRC is its one piece), else one per PIECE_SIZE bytes."""
    return 0 if length <= PIECE_SIZE else -(-length // PIECE_SIZE)


class Footer(NamedTuple):
    """The decoded footer record (``tail_size`` and ``tail_crc`` are 0 before 1.4)."""

    version_major: int
    version_minor: int
    flags: int
    entry_count: int
    data_records: int
    section_count: int
    tail_size: int = 0
    tail_crc: int = 0


# CRC-32 as zlib computes it (crc32(data, value=0)), using zlib-ng's vectorised code.
# Bound directly, not wrapped: it is on every lookup and checked read.
crc32 = zlib_ng.crc32


def header_size(record_count: int) -> int:
    """Bytes taken by the container header for ``record_count`` records."""
    return 12 + 12 * record_count


def record_count_for(data_records: int, section_count: int = WRITTEN_SECTION_COUNT) -> int:
    """Total records in an archive with ``data_records`` data records (section 2)."""
    count = data_records + 2 * section_count + 1
    return count if count % 2 else count + 1


def pack_footer(entry_count: int, data_records: int, minor: int = PIECES_SINCE_MINOR,
                tail: bytes | memoryview | None = None) -> bytes:
    """Encode the footer of a version 1.``minor`` archive (1.2; 1.3 with attributes; 1.4
    with ``tail``, the tail section's bytes, whose length and CRC it records; 1.5 with
    codecs, flag FLAG_CODECS)."""
    if (tail is not None) != (minor >= INDEX_SINCE_MINOR):
        raise ValueError(f"a version 1.{minor} footer {'needs' if tail is None else 'has no'} tail")
    flags = FLAG_CODECS if minor >= CODECS_SINCE_MINOR else 0
    footer = bytearray(FOOTER.pack(
        MAGIC, VERSION_MAJOR, minor, flags, entry_count, data_records, section_count_for(minor), bytes(28)
    ))
    if tail is not None:
        FOOTER_TAIL.pack_into(footer, _FOOTER_TAIL_AT, len(tail), 0)
        FOOTER_TAIL.pack_into(footer, _FOOTER_TAIL_AT, len(tail), tail_crc(tail, footer))
    return bytes(footer)


def unpack_footer(data: bytes, where: str) -> Footer:
    """Decode and check a footer; ``where`` names the archive in error messages."""
    if len(data) != FOOTER_SIZE:
        raise FormatError(
            f"{where}: not a packfs archive, or truncated or extended: its last record is "
            f"{len(data)} bytes, expected the {FOOTER_SIZE}-byte footer"
        )
    if data[:8] != MAGIC:
        raise FormatError(
            f"{where}: not a packfs archive: its last record does not start with {MAGIC!r}"
        )
    magic, major, minor, flags, entries, data_records, sections, _reserved = FOOTER.unpack(data)
    if major != VERSION_MAJOR:
        raise FormatError(
            f"{where}: unsupported format version {major}.{minor}; "
            f"this packfs reads version {VERSION_MAJOR}.x"
        )
    if flags & ~KNOWN_FLAGS:
        raise FormatError(f"{where}: unknown feature flags {flags & ~KNOWN_FLAGS:#x} in the footer "
                          f"(written by a newer packfs: upgrade packfs to read it)")
    if flags & FLAG_CODECS and minor < CODECS_SINCE_MINOR:
        raise FormatError(f"{where}: the footer sets the codecs flag in a version {major}.{minor} archive, "
                          f"expected 1.{CODECS_SINCE_MINOR} or later")
    # A flagged archive has the codec sections whatever its minor version says.
    # (A higher minor version without the flag has what 1.4 has, and what it adds an
    # older reader may ignore.)
    needed = section_count_for(CODECS_SINCE_MINOR if flags & FLAG_CODECS else min(minor, INDEX_SINCE_MINOR))
    if sections < needed:
        raise FormatError(
            f"{where}: footer lists {sections} sections, version {major}.{minor} needs {needed}"
        )
    if entries < 1:
        raise FormatError(f"{where}: footer says the path table has {entries} entries, expected >= 1")
    tail_size = tail_crc_value = 0
    if minor >= INDEX_SINCE_MINOR:
        tail_size, tail_crc_value = FOOTER_TAIL.unpack_from(data, _FOOTER_TAIL_AT)
        if tail_size < TAIL_HEADER.size:
            raise FormatError(f"{where}: footer gives a tail of {tail_size} bytes, expected at least "
                              f"{TAIL_HEADER.size}")
    return Footer(major, minor, flags, entries, data_records, sections, tail_size, tail_crc_value)


# Other formats a user may hand packfs by mistake, by the bytes that start them, so
# the error says what the file is instead of reporting bogus record counts.  (offset,
# magic, description); an FFRecord container has no magic, so these are tried first.
_FOREIGN_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (257, b"ustar", "a tar archive"),
    (0, b"PK\x03\x04", "a zip archive"),
    (0, b"PK\x05\x06", "a zip archive (empty)"),
    (0, b"\x1f\x8b", "gzip-compressed data"),
    (0, b"BZh", "bzip2-compressed data"),
    (0, b"\xfd7zXZ\x00", "xz-compressed data"),
    (0, b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
    (0, b"hsqs", "a squashfs image"),
    (0, b"DWARFS", "a DwarFS image"),
    (0, b"\x93NUMPY", "a numpy .npy file"),
    (0, b"\x89PNG", "a PNG image"),
    (0, b"\xff\xd8\xff", "a JPEG image"),
    (0, b"SQLite format 3\x00", "an SQLite database"),
    (0, b"\x7fELF", "an ELF executable"),
)
SNIFF_BYTES = 512


def foreign_format(head: bytes) -> str | None:
    """What a file starting with ``head`` (its first SNIFF_BYTES) is, if it is a
    format packfs knows not to be an archive; None otherwise."""
    if not head:
        return "empty"
    for offset, magic, description in _FOREIGN_MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return description
    if _is_text(head):
        return "a text file"
    return None


def _is_text(head: bytes) -> bool:
    """Whether ``head`` is UTF-8 text (no control characters but whitespace).  A
    container header never is: its record count's high bytes are NUL."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head)  # a character cut at the end is fine
    except UnicodeDecodeError:
        return False
    return bool(text) and not any(ord(c) < 32 and c not in "\t\n\r\f\v" or c == "\x7f" for c in text)
