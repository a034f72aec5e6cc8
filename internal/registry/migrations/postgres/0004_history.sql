-- History: one row per write of a students row (created, updated, restored, deleted,
-- released, adopted), written in the same transaction as the write, so a write and its
-- history row commit or roll back together. id orders them. The values copied from the
-- students row (namespace to generation) are kept as they were. Rows older than the
-- controller's --history-retention are pruned, in small batches (the at index).
CREATE TABLE student_history (
    id           BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           TIMESTAMPTZ NOT NULL CHECK (isfinite(at)),
    uid          TEXT        NOT NULL CHECK (uid <> ''),
    namespace    TEXT,
    name         TEXT,
    student_name TEXT,
    school       TEXT,
    generation   BIGINT,
    action       TEXT        NOT NULL CHECK (action IN ('created', 'updated', 'restored', 'deleted', 'released', 'adopted')),
    owner        TEXT        NOT NULL CHECK (owner <> ''),
    cause        TEXT        NOT NULL CHECK (cause <> ''),
    actor        TEXT        NOT NULL CHECK (actor <> '')
);
CREATE INDEX student_history_student ON student_history (namespace, name, id);
CREATE INDEX student_history_at ON student_history (at);
