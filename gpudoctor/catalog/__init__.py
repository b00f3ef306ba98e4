"""What the hardware's numbers mean, shipped as data: NVIDIA's Xid catalog (xid) and each GPU SKU's physical limits
and healthy floors for the deep tier (deep_limits)."""
