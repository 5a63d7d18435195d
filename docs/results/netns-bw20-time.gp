set terminal pngcairo size 900,560 noenhanced
set output 'netns-bw20-time.png'
set title 'Real shaped links: stragglers between network namespaces, against the virtual clock [bw20]'
set xlabel 'virtual time (s)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'netns-bw20-time.dat' index 0 with linespoints title 'calibration', 'netns-bw20-time.dat' index 1 with linespoints title 'diloco-real', 'netns-bw20-time.dat' index 2 with linespoints title 'diloco-virtual', 'netns-bw20-time.dat' index 3 with linespoints title 'gasloc-1peer-tb-real', 'netns-bw20-time.dat' index 4 with linespoints title 'gasloc-1peer-tb-virtual', 'netns-bw20-time.dat' index 5 with linespoints title 'gasloc-2peer-tb-real', 'netns-bw20-time.dat' index 6 with linespoints title 'gasloc-2peer-tb-virtual', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
