"""The inference server a campaign runs: started, watched and stopped here or on a target (launch, remote), marked
as ours (marker), and its log read the way an expert would (logscan)."""
