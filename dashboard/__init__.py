"""Terminal and web views over the session store and the live feed."""
