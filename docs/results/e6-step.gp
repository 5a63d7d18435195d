set terminal pngcairo size 900,560 noenhanced
set output 'e6-step.png'
set title 'E6: 32 micro workers in one process'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e6-step.dat' index 0 with linespoints title 'gasloc-1peer', 'e6-step.dat' index 1 with linespoints title 'gasloc-2peer', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
