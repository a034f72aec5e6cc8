-- Timestamps in SQLite's own datetime() form, 'YYYY-MM-DD HH:MM:SS' in UTC, which its
-- date functions read and which sorts as text in time order; until now the rows held
-- Go's time.Time.String() form ('2026-11-30 09:14:16.803903461 +0000 UTC'), which
-- they read as NULL. CHECK constraints refuse what the controller cannot read; SQLite
-- adds them only by rebuilding the table.
--
-- Rows already there that break a constraint (a writer past the old schema) are kept
-- as they are, with the checks off for the copy: the controller skips and counts
-- them, and rewrites a live Student's own row. The migration runner discards this
-- connection afterwards, so the setting never reaches another statement.
PRAGMA ignore_check_constraints = ON;

CREATE TABLE students_checked (
    uid          TEXT      NOT NULL PRIMARY KEY CHECK (typeof(uid) = 'text' AND uid <> ''),
    namespace    TEXT      NOT NULL CHECK (typeof(namespace) = 'text' AND namespace <> ''),
    name         TEXT      NOT NULL CHECK (typeof(name) = 'text' AND name <> ''),
    student_name TEXT      NOT NULL CHECK (typeof(student_name) = 'text'),
    school       TEXT      NOT NULL CHECK (typeof(school) = 'text'),
    owner        TEXT               CHECK (owner IS NULL OR (typeof(owner) = 'text' AND owner <> '')),
    generation   INTEGER   NOT NULL CHECK (typeof(generation) = 'integer'),
    created_at   TIMESTAMP NOT NULL CHECK (created_at IS datetime(created_at)),
    updated_at   TIMESTAMP NOT NULL CHECK (updated_at IS datetime(updated_at)),
    released_at  TIMESTAMP          CHECK (released_at IS datetime(released_at))
);

-- Every distinct stored time, with its UTC datetime() form: Go's 'DATE TIME[.FRACTION]
-- +HHMM ZONE' is rewritten to 'DATE TIME[.FRACTION]+HH:MM', which datetime() reads and
-- turns into UTC; any other form datetime() reads is turned into UTC as well, and a
-- value it cannot read is kept as it is.
CREATE TEMP TABLE time_forms (value PRIMARY KEY, utc);
INSERT INTO time_forms (value)
SELECT created_at FROM students UNION SELECT updated_at FROM students
UNION SELECT released_at FROM students WHERE released_at IS NOT NULL
UNION SELECT applied_at FROM schema_migrations;
UPDATE time_forms SET utc = COALESCE(datetime(CASE
    WHEN value GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]* [+-][0-9][0-9][0-9][0-9] *'
    THEN substr(value, 1, 18 + instr(substr(value, 20), ' '))
         || substr(value, 20 + instr(substr(value, 20), ' '), 3) || ':'
         || substr(value, 23 + instr(substr(value, 20), ' '), 2)
    ELSE value END), value);

INSERT INTO students_checked (uid, namespace, name, student_name, school, owner, generation, created_at, updated_at, released_at)
SELECT uid, namespace, name, student_name, school, owner, generation,
       (SELECT utc FROM time_forms WHERE value = created_at),
       (SELECT utc FROM time_forms WHERE value = updated_at),
       (SELECT utc FROM time_forms WHERE value = released_at)
FROM students;
UPDATE schema_migrations SET applied_at = (SELECT utc FROM time_forms WHERE value = applied_at);

DROP TABLE time_forms;
DROP TABLE students;
ALTER TABLE students_checked RENAME TO students;
CREATE INDEX students_owner ON students (owner);
CREATE INDEX students_namespace_name ON students (namespace, name);

PRAGMA ignore_check_constraints = OFF;
