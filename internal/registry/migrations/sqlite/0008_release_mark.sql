-- released_by and release_cause: the owner that released a row, and why (the cause
-- its history row records: finalizer, sweep, stale-cache). A row released because its
-- Student was found missing keeps the deletion policy it had; only
-- `student-controller registry prune` deletes such a row, when asked, and a Student of
-- the row's uid that comes back (an etcd restore) takes it back. Both are NULL while
-- the row is owned, and on rows released before schema 8.
-- SQLite checks every row against every CHECK when a column with one is added; rows
-- written past the checks are kept (as in 0003), with the checks off for this
-- connection, which the migration runner then discards.
PRAGMA ignore_check_constraints = ON;
ALTER TABLE students ADD COLUMN released_by TEXT
    CHECK (released_by IS NULL OR (typeof(released_by) = 'text' AND released_by <> ''));
ALTER TABLE students ADD COLUMN release_cause TEXT
    CHECK (release_cause IS NULL OR (typeof(release_cause) = 'text' AND release_cause <> ''));
CREATE INDEX students_released_by ON students (released_by) WHERE released_by IS NOT NULL;
PRAGMA ignore_check_constraints = OFF;
