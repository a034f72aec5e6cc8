package registry

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
)

// openDB opens the database of src. On PostgreSQL a password from password is read
// for every new connection, so that a rotated Secret is picked up without a restart,
// and a connection to a server that turned read-only is dropped (dropOnReadOnly).
func openDB(src source, password func() (string, error)) (*sql.DB, error) {
	if src.withPassword == nil {
		return sql.Open(src.dialect.driver, src.dsn)
	}
	probe, err := sql.Open(src.dialect.driver, "")
	if err != nil {
		return nil, err
	}
	drv := probe.Driver()
	if err := probe.Close(); err != nil {
		return nil, err
	}
	return sql.OpenDB(&passwordConnector{drv: drv, src: src, password: password}), nil
}

// passwordConnector connects to PostgreSQL with the password as it is when the
// connection opens, if there is one.
type passwordConnector struct {
	drv      driver.Driver
	src      source
	password func() (string, error)
}

func (c *passwordConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dsn := c.src.dsn
	if c.password != nil {
		pw, err := c.password()
		if err != nil {
			return nil, fmt.Errorf("read the registry password: %w", err)
		}
		dsn = c.src.withPassword(pw)
	}
	var conn driver.Conn
	var err error
	if dc, ok := c.drv.(driver.DriverContext); ok {
		var connector driver.Connector
		if connector, err = dc.OpenConnector(dsn); err != nil {
			return nil, err
		}
		conn, err = connector.Connect(ctx)
	} else {
		conn, err = c.drv.Open(dsn)
	}
	if err != nil {
		return nil, err
	}
	return &dropOnReadOnly{Conn: conn}, nil
}

func (c *passwordConnector) Driver() driver.Driver { return c.drv }
