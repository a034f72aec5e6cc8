package registry

// SetFenceStall makes TakeFence of r run stall inside its transaction, after its
// write: a controller paused there.
func SetFenceStall(r *Registry, stall func()) { r.fenceStall = stall }
