package registry

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
)

// openDB opens the database of src. A PostgreSQL password from password is read for
// every new connection, so that a rotated Secret is picked up without a restart.
func openDB(src source, password func() (string, error)) (*sql.DB, error) {
	if password == nil || src.withPassword == nil {
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

// passwordConnector connects with the password as it is when the connection opens.
type passwordConnector struct {
	drv      driver.Driver
	src      source
	password func() (string, error)
}

func (c *passwordConnector) Connect(ctx context.Context) (driver.Conn, error) {
	pw, err := c.password()
	if err != nil {
		return nil, fmt.Errorf("read the registry password: %w", err)
	}
	dsn := c.src.withPassword(pw)
	if dc, ok := c.drv.(driver.DriverContext); ok {
		connector, err := dc.OpenConnector(dsn)
		if err != nil {
			return nil, err
		}
		return connector.Connect(ctx)
	}
	return c.drv.Open(dsn)
}

func (c *passwordConnector) Driver() driver.Driver { return c.drv }
