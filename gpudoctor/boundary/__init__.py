"""What stands between a process and the GPU outside LXC, as pure semantics: the platform and its advice (platform),
CDI specs (cdi), systemd DevicePolicy/DeviceAllow (systemd_devices)."""
