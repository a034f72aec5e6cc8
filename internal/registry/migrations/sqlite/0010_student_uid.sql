-- student_uid: the uid of the Student bound to a row whose key is not its Student's:
-- a row that `student-controller registry adopt` bound to a Student it made keeps the
-- uid another system inserted it with, so that system goes on writing it by its own
-- key, and the Student names the row (annotation bolingcavalry.k8s.io/row-uid). NULL:
-- the row's uid is its Student's.
-- SQLite checks every row against every CHECK when a column with one is added; rows
-- written past the checks are kept (as in 0003), with the checks off for this
-- connection, which the migration runner then discards.
PRAGMA ignore_check_constraints = ON;
ALTER TABLE students ADD COLUMN student_uid TEXT
    CHECK (student_uid IS NULL OR (typeof(student_uid) = 'text' AND student_uid <> ''));
PRAGMA ignore_check_constraints = OFF;
