set terminal pngcairo size 900,560 noenhanced
set output 'e3-step.png'
set title 'E3: a 10% straggler, time to target on the virtual clock'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e3-step.dat' index 0 with linespoints title 'diloco', 'e3-step.dat' index 1 with linespoints title 'gasloc-1peer-tb', 'e3-step.dat' index 2 with linespoints title 'gasloc-2peer-tb', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
