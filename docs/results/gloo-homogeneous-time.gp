set terminal pngcairo size 900,560 noenhanced
set output 'gloo-homogeneous-time.png'
set title 'Real runs: a straggler over Gloo on one host, against the virtual clock [homogeneous]'
set xlabel 'virtual time (s)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'gloo-homogeneous-time.dat' index 0 with linespoints title 'calibration', 'gloo-homogeneous-time.dat' index 1 with linespoints title 'diloco-real', 'gloo-homogeneous-time.dat' index 2 with linespoints title 'diloco-virtual', 'gloo-homogeneous-time.dat' index 3 with linespoints title 'gasloc-1peer-tb-real', 'gloo-homogeneous-time.dat' index 4 with linespoints title 'gasloc-1peer-tb-virtual', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
