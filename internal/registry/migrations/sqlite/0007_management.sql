-- management: 'Observe' while the row's Student only observes it (spec.management:
-- Observe, or a Student that `student-controller registry adopt` made from the row);
-- NULL while the controller manages it. An observed row is never deleted or released
-- by a path that finds it without its Student (the sweep, the undo of a stale write):
-- deleting an observed Student leaves its row as it is.
--
-- generation, created_at and updated_at take defaults (0, and now), so that another
-- system adds a row for adopt with uid, namespace, name, student_name and school alone.
-- SQLite adds defaults only by rebuilding the table; indexes and triggers that another
-- system added to it are not kept (CHANGELOG). Rows that break a check (a writer
-- past the schema) are kept as they are, with the checks off for the copy; the
-- migration runner discards this connection afterwards.
PRAGMA ignore_check_constraints = ON;

CREATE TABLE students_v7 (
    uid             TEXT      NOT NULL PRIMARY KEY CHECK (typeof(uid) = 'text' AND uid <> ''),
    namespace       TEXT      NOT NULL CHECK (typeof(namespace) = 'text' AND namespace <> ''),
    name            TEXT      NOT NULL CHECK (typeof(name) = 'text' AND name <> ''),
    student_name    TEXT      NOT NULL CHECK (typeof(student_name) = 'text'),
    school          TEXT      NOT NULL CHECK (typeof(school) = 'text'),
    owner           TEXT               CHECK (owner IS NULL OR (typeof(owner) = 'text' AND owner <> '')),
    generation      INTEGER   NOT NULL DEFAULT 0 CHECK (typeof(generation) = 'integer'),
    created_at      TIMESTAMP NOT NULL DEFAULT (datetime('now')) CHECK (created_at IS datetime(created_at)),
    updated_at      TIMESTAMP NOT NULL DEFAULT (datetime('now')) CHECK (updated_at IS datetime(updated_at)),
    released_at     TIMESTAMP          CHECK (released_at IS datetime(released_at)),
    deletion_policy TEXT               CHECK (deletion_policy IS NULL OR deletion_policy IN ('Delete', 'Orphan')),
    management      TEXT               CHECK (management IS NULL OR management = 'Observe')
);
INSERT INTO students_v7 (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at, deletion_policy)
SELECT uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at, deletion_policy
FROM students;
DROP TABLE students;
ALTER TABLE students_v7 RENAME TO students;
CREATE INDEX students_owner ON students (owner);
CREATE INDEX students_namespace_name ON students (namespace, name);

PRAGMA ignore_check_constraints = OFF;
