-- management: 'Observe' while the row's Student only observes it (spec.management:
-- Observe, or a Student that `student-controller registry adopt` made from the row);
-- NULL while the controller manages it. An observed row is never deleted or released
-- by a path that finds it without its Student (the sweep, the undo of a stale write):
-- deleting an observed Student leaves its row as it is.
--
-- generation, created_at and updated_at take defaults (0, and now), so that another
-- system adds a row for adopt with uid, namespace, name, student_name and school alone.
-- The check is NOT VALID, as 0002's: the rows there are not scanned under the lock.
ALTER TABLE students
    ADD COLUMN management TEXT,
    ADD CONSTRAINT students_management CHECK (management = 'Observe') NOT VALID,
    ALTER COLUMN generation SET DEFAULT 0,
    ALTER COLUMN created_at SET DEFAULT now(),
    ALTER COLUMN updated_at SET DEFAULT now();
