// Translation unit that carries the precompiled header (see CMakeLists.txt).
