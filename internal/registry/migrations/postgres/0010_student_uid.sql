-- student_uid: the uid of the Student bound to a row whose key is not its Student's:
-- a row that `student-controller registry adopt` bound to a Student it made keeps the
-- uid another system inserted it with, so that system goes on writing it by its own
-- key, and the Student names the row (annotation bolingcavalry.k8s.io/row-uid). NULL:
-- the row's uid is its Student's. The check is NOT VALID, as 0002's: the rows there
-- are not scanned under the lock.
ALTER TABLE students
    ADD COLUMN student_uid TEXT,
    ADD CONSTRAINT students_student_uid_nonempty CHECK (student_uid <> '') NOT VALID;
