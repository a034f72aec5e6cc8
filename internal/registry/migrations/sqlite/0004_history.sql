-- History: one row per write of a students row (created, updated, restored, deleted,
-- released, adopted), written in the same transaction as the write, so a write and its
-- history row commit or roll back together. id orders them. The values copied from the
-- students row (namespace to generation) are kept as they were, unchecked: a row
-- written past the students table's checks can still be deleted, and its history row
-- says what it held. at is in the form of SQLite's datetime(), in UTC, so that its date
-- functions read it and text order is time order. Rows older than the controller's
-- --history-retention are pruned, in small batches (the at index).
CREATE TABLE student_history (
    id           INTEGER   PRIMARY KEY AUTOINCREMENT,
    at           TIMESTAMP NOT NULL CHECK (at IS datetime(at)),
    uid          TEXT      NOT NULL CHECK (typeof(uid) = 'text' AND uid <> ''),
    namespace    TEXT,
    name         TEXT,
    student_name TEXT,
    school       TEXT,
    generation   INTEGER,
    action       TEXT      NOT NULL CHECK (action IN ('created', 'updated', 'restored', 'deleted', 'released', 'adopted')),
    owner        TEXT      NOT NULL CHECK (typeof(owner) = 'text' AND owner <> ''),
    cause        TEXT      NOT NULL CHECK (typeof(cause) = 'text' AND cause <> ''),
    actor        TEXT      NOT NULL CHECK (typeof(actor) = 'text' AND actor <> '')
);
CREATE INDEX student_history_student ON student_history (namespace, name, id);
CREATE INDEX student_history_at ON student_history (at);
