-- The students table is a public contract: other systems read it. See the README.
CREATE TABLE students (
    uid          TEXT        NOT NULL PRIMARY KEY, -- the Student object's metadata.uid
    namespace    TEXT        NOT NULL,             -- the object's namespace
    name         TEXT        NOT NULL,             -- the object's name
    student_name TEXT        NOT NULL,             -- spec.name, the display name
    school       TEXT        NOT NULL,             -- spec.school
    owner        TEXT,                             -- the controller instance that owns the row; NULL once released
    generation   BIGINT      NOT NULL,             -- the object's metadata.generation last written
    created_at   TIMESTAMPTZ NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL,
    released_at  TIMESTAMPTZ                       -- when the row was released (deletionPolicy Orphan)
);
CREATE INDEX students_owner ON students (owner);
CREATE INDEX students_namespace_name ON students (namespace, name);
