package registry

// SetFenceStall makes TakeFence of r run stall inside its transaction, after its
// write: a controller paused there.
func SetFenceStall(r *Registry, stall func()) { r.fenceStall = stall }

// SetSchemaReadFault makes FenceIsLease of r fail with fault's error, when it returns
// one: a database blip.
func SetSchemaReadFault(r *Registry, fault func() error) { r.schemaReadFault = fault }

// SetSyncPath makes Backup flush its file and folder with sync; the returned func puts
// back the real one.
func SetSyncPath(sync func(path string) error) (undo func()) {
	real := syncPath
	syncPath = sync
	return func() { syncPath = real }
}
