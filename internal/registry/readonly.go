package registry

import (
	"context"
	"database/sql/driver"
	"errors"
)

// A PostgreSQL server that turned read-only under an open connection (a primary
// demoted after a fail-over, a cluster put in read-only mode) answers every write on
// it with SQLSTATE 25006 for as long as the connection lives. Such a connection is
// dropped: the next one goes, with target_session_attrs=read-write, to the server that
// takes writes now.
const sqlStateReadOnly = "25006"

// readOnly reports whether err says the server refused a write as read-only.
func readOnly(err error) bool {
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && coded.SQLState() == sqlStateReadOnly
}

// dropOnReadOnly wraps a driver connection so that database/sql discards it (at its
// next reset or return to the pool) once the server has refused a write as read-only.
type dropOnReadOnly struct {
	driver.Conn
	bad bool
}

func (c *dropOnReadOnly) note(err error) error {
	if readOnly(err) {
		c.bad = true
	}
	return err
}

func (c *dropOnReadOnly) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	var s driver.Stmt
	var err error
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		s, err = p.PrepareContext(ctx, query)
	} else {
		s, err = c.Conn.Prepare(query)
	}
	if err != nil {
		return nil, c.note(err)
	}
	return &noteStmt{Stmt: s, conn: c}, nil
}

func (c *dropOnReadOnly) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	b, ok := c.Conn.(driver.ConnBeginTx)
	if !ok {
		return nil, errors.New("the driver cannot begin a transaction with options")
	}
	tx, err := b.BeginTx(ctx, opts)
	return tx, c.note(err)
}

func (c *dropOnReadOnly) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	res, err := e.ExecContext(ctx, query, args)
	return res, c.note(err)
}

func (c *dropOnReadOnly) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	rows, err := q.QueryContext(ctx, query, args)
	return rows, c.note(err)
}

func (c *dropOnReadOnly) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return c.note(p.Ping(ctx))
	}
	return nil
}

func (c *dropOnReadOnly) CheckNamedValue(v *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (c *dropOnReadOnly) ResetSession(ctx context.Context) error {
	if c.bad {
		return driver.ErrBadConn
	}
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *dropOnReadOnly) IsValid() bool {
	if c.bad {
		return false
	}
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// noteStmt is a prepared statement of a dropOnReadOnly connection.
type noteStmt struct {
	driver.Stmt
	conn *dropOnReadOnly
}

func (s *noteStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	e, ok := s.Stmt.(driver.StmtExecContext)
	if !ok {
		return nil, errors.New("the driver's statements cannot execute with a context")
	}
	res, err := e.ExecContext(ctx, args)
	return res, s.conn.note(err)
}

func (s *noteStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := s.Stmt.(driver.StmtQueryContext)
	if !ok {
		return nil, errors.New("the driver's statements cannot query with a context")
	}
	rows, err := q.QueryContext(ctx, args)
	return rows, s.conn.note(err)
}
