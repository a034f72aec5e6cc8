package registry

// SetFenceStall makes TakeFence of r run stall inside its transaction, after its
// write: a controller paused there.
func SetFenceStall(r *Registry, stall func()) { r.fenceStall = stall }

// SetSchemaReadFault makes FenceIsLease of r fail with fault's error, when it returns
// one: a database blip.
func SetSchemaReadFault(r *Registry, fault func() error) { r.schemaReadFault = fault }
