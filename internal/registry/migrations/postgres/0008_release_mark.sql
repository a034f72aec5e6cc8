-- released_by and release_cause: the owner that released a row, and why (the cause
-- its history row records: finalizer, sweep, stale-cache). A row released because its
-- Student was found missing keeps the deletion policy it had; only
-- `student-controller registry prune` deletes such a row, when asked, and a Student of
-- the row's uid that comes back (an etcd restore) takes it back. Both are NULL while
-- the row is owned, and on rows released before schema 8. The checks are NOT VALID, as
-- 0002's: the rows there are not scanned under the lock.
ALTER TABLE students
    ADD COLUMN released_by TEXT,
    ADD COLUMN release_cause TEXT,
    ADD CONSTRAINT students_released_by_nonempty CHECK (released_by <> '') NOT VALID,
    ADD CONSTRAINT students_release_cause_nonempty CHECK (release_cause <> '') NOT VALID;
CREATE INDEX students_released_by ON students (released_by) WHERE released_by IS NOT NULL;
