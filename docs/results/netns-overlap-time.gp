set terminal pngcairo size 900,560 noenhanced
set output 'netns-overlap-time.png'
set title 'Overlapped rounds on real shaped links: a 10% straggler between network namespaces, against the virtual clock'
set xlabel 'virtual time (s)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'netns-overlap-time.dat' index 0 with linespoints title 'calibration', 'netns-overlap-time.dat' index 1 with linespoints title 'diloco-t0-real', 'netns-overlap-time.dat' index 2 with linespoints title 'diloco-t0-virtual', 'netns-overlap-time.dat' index 3 with linespoints title 'diloco-t29-real', 'netns-overlap-time.dat' index 4 with linespoints title 'diloco-t29-virtual', 'netns-overlap-time.dat' index 5 with linespoints title 'gasloc-1peer-tb-t0-real', 'netns-overlap-time.dat' index 6 with linespoints title 'gasloc-1peer-tb-t0-virtual', 'netns-overlap-time.dat' index 7 with linespoints title 'gasloc-1peer-tb-t29-real', 'netns-overlap-time.dat' index 8 with linespoints title 'gasloc-1peer-tb-t29-virtual', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
