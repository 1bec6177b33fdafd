"""Tests of the streaming layer; the ones marked ``kafka`` run against a real broker."""
