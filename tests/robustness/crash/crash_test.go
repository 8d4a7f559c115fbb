package crash
